/* Splitting a model's weights across ranks so that every output element
 * of every matmul is computed by one rank, with the whole input row, as on
 * one CPU (exact: the same bits at any TP size). Each rank computes a slice
 * of the output features; its part of a row-major weight is a range of its
 * rows: a view, a pointer into the model's tensor, never a copy.
 *   Q, K, V and their biases: the rank's heads;
 *   gate, up: its FFN columns (llmi_tp_slice of n_ff);
 *   O, down: its embedding features (llmi_tp_slice of n_embd), reading the
 *     whole attention output / FFN row gathered from every rank;
 *   output (LM head): its vocabulary rows;
 *   replicated: embeddings, norms, QK-norms, RoPE factors, and routed
 *     (mixture-of-experts) FFNs, which every rank runs whole.
 * KV heads: each rank takes n_head_kv / N of them; with fewer KV heads than
 * ranks (N a multiple of n_head_kv) each rank holds the one KV head its
 * query heads use, so ranks sharing a group hold copies (split.c). */
#include "backend/tp/shard.h"

void llmi_tp_weights_free(llmi_tp_weights *w) {
    if (!w)
        return;
    for (uint32_t r = 0; r < w->n_ranks; r++) {
        llmi_cpu_weights_free(w->cpu[r]);
        llmi_free(w->shard[r].layers);
    }
    llmi_free(w);
}

llm_status llmi_tp_weights_create(const llm_model *m, uint32_t n_ranks, llmi_tp_weights **out) {
    *out = NULL;
    LLMI_TRY(llmi_tp_check(m, n_ranks));
    const llmi_hparams *hp = &m->hp;
    llmi_tp_weights *w = llmi_calloc(1, sizeof *w);
    if (!w)
        return llmi_oom("tensor-parallel weights");
    w->n_ranks = n_ranks;
    const uint32_t hq = hp->n_head / n_ranks, hd = hp->head_dim;
    for (uint32_t r = 0; r < n_ranks; r++) {
        llm_model *s = &w->shard[r];
        *s = *m;
        s->layers = llmi_calloc(hp->n_layer, sizeof *s->layers);
        if (!s->layers)
            goto oom;
        uint32_t kv0, n_kv;
        llmi_tp_split_heads(hp->n_head_kv, n_ranks, r, &kv0, &n_kv);
        s->hp.n_head = hq;
        s->hp.n_head_kv = n_kv;
        uint32_t f0, f1, e0, e1, v1;
        llmi_tp_slice(hp->n_ff, n_ranks, r, &f0, &f1);
        llmi_tp_slice(hp->n_embd, n_ranks, r, &e0, &e1);
        llmi_tp_slice(hp->n_vocab, n_ranks, r, &w->vocab0[r], &v1);
        w->kv0[r] = kv0;
        w->ff0[r] = f0;
        w->embd0[r] = e0;
        s->hp.n_ff = f1 - f0;
        s->hp.n_vocab = v1 - w->vocab0[r];
        s->w[LLMI_ROLE_OUTPUT] =
            llmi_weight_rows(m->w[LLMI_ROLE_OUTPUT], w->vocab0[r], s->hp.n_vocab);
        const uint64_t q0 = (uint64_t)r * hq * hd, kvd0 = (uint64_t)kv0 * hd;
        const uint64_t nq = (uint64_t)hq * hd, nkv = (uint64_t)n_kv * hd;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const llmi_weight *src = m->layers[l].w;
            llmi_weight *dst = s->layers[l].w;
            memcpy(dst, src, sizeof s->layers[l].w);
            dst[LLMI_ROLE_Q] = llmi_weight_rows(src[LLMI_ROLE_Q], q0, nq);
            dst[LLMI_ROLE_K] = llmi_weight_rows(src[LLMI_ROLE_K], kvd0, nkv);
            dst[LLMI_ROLE_V] = llmi_weight_rows(src[LLMI_ROLE_V], kvd0, nkv);
            dst[LLMI_ROLE_Q_BIAS] = llmi_weight_elems(src[LLMI_ROLE_Q_BIAS], q0, nq);
            dst[LLMI_ROLE_K_BIAS] = llmi_weight_elems(src[LLMI_ROLE_K_BIAS], kvd0, nkv);
            dst[LLMI_ROLE_V_BIAS] = llmi_weight_elems(src[LLMI_ROLE_V_BIAS], kvd0, nkv);
            dst[LLMI_ROLE_GATE] = llmi_weight_rows(src[LLMI_ROLE_GATE], f0, f1 - f0);
            dst[LLMI_ROLE_UP] = llmi_weight_rows(src[LLMI_ROLE_UP], f0, f1 - f0);
            dst[LLMI_ROLE_O] = llmi_weight_rows(src[LLMI_ROLE_O], e0, e1 - e0);
            dst[LLMI_ROLE_DOWN] = llmi_weight_rows(src[LLMI_ROLE_DOWN], e0, e1 - e0);
            /* The fused tensors stay whole: the step reads only their views. */
        }
    }
    for (uint32_t r = 0; r < n_ranks; r++) {
        llm_status st = llmi_cpu_weights_load(&w->shard[r], &w->cpu[r]);
        if (st != LLM_OK) {
            llmi_tp_weights_free(w);
            return st;
        }
    }
    *out = w;
    return LLM_OK;
oom:
    llmi_tp_weights_free(w);
    return llmi_oom("tensor-parallel weight shards");
}
