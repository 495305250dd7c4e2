/* Splitting a model's weights across ranks (Megatron-style):
 *   column-parallel (each rank computes some output features): Q, K, V and
 *     their biases by heads, gate and up by FFN columns, the output
 *     projection by vocabulary rows. Rows of a row-major weight, so a rank's
 *     part is a view: a pointer into the model's tensor.
 *   row-parallel (each rank reads its part of the input features, outputs
 *     partial sums that an all-reduce adds): O and down. Column slices of a
 *     row-major weight: repacked into buffers of our own, which is why their
 *     splits must fall on quantization block boundaries.
 *   replicated: embeddings, norms, QK-norms, RoPE factors.
 * KV heads: each rank takes n_head_kv / N of them; with fewer KV heads than
 * ranks (N a multiple of n_head_kv) each rank holds the one KV head its
 * query heads use, so ranks sharing a group hold copies. */
#include "backend/tp/shard.h"

void llmi_tp_split_heads(uint32_t n_head_kv, uint32_t n_ranks, uint32_t rank, uint32_t *kv0,
                         uint32_t *n_kv) {
    if (n_head_kv % n_ranks == 0) {
        *n_kv = n_head_kv / n_ranks;
        *kv0 = rank * *n_kv;
    } else {
        *n_kv = 1;
        *kv0 = rank * n_head_kv / n_ranks;
    }
}

uint32_t llmi_tp_kv_owner(uint32_t n_head_kv, uint32_t n_ranks, uint32_t head) {
    if (n_head_kv % n_ranks == 0)
        return head / (n_head_kv / n_ranks);
    return head * (n_ranks / n_head_kv);
}

/* Why m does not split across n ranks (into why), or true when it does. */
static bool splits(const llm_model *m, uint32_t n, char *why, size_t cap) {
    const llmi_hparams *hp = &m->hp;
    if (n == 1)
        return true;
    if (hp->features.n_expert) {
        snprintf(why, cap, "mixture-of-experts layers (%u experts) are not split",
                 hp->features.n_expert);
        return false;
    }
    if (hp->n_head % n) {
        snprintf(why, cap, "%u attention heads do not split in %u", hp->n_head, n);
        return false;
    }
    if (hp->n_head_kv % n && n % hp->n_head_kv) {
        snprintf(why, cap, "%u KV heads neither split in %u nor replicate to %u", hp->n_head_kv, n,
                 n);
        return false;
    }
    if (hp->n_ff % n) {
        snprintf(why, cap, "the FFN width %u does not split in %u", hp->n_ff, n);
        return false;
    }
    const uint32_t o_cols = hp->n_head / n * hp->head_dim, down_cols = hp->n_ff / n;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const llmi_weight *o = &m->layers[l].w[LLMI_ROLE_O];
        const llmi_weight *down = &m->layers[l].w[LLMI_ROLE_DOWN];
        const llmi_ttype_info *oi = llmi_ttype_get(o->type), *di = llmi_ttype_get(down->type);
        if (!oi || !di || o_cols % oi->block || down_cols % di->block) {
            snprintf(why, cap,
                     "layer %u: the O and down slices (%u and %u columns) do not fall on "
                     "%s/%s block boundaries",
                     l, o_cols, down_cols, oi ? oi->name : "?", di ? di->name : "?");
            return false;
        }
    }
    return true;
}

llm_status llmi_tp_check(const llm_model *m, uint32_t n_ranks) {
    if (n_ranks == 0 || n_ranks > LLMI_TP_MAX)
        return llmi_error(LLM_ERR_UNSUPPORTED, "tensor_parallel %u: sizes 1 to %u are supported",
                          n_ranks, LLMI_TP_MAX);
    char why[256];
    if (splits(m, n_ranks, why, sizeof why))
        return LLM_OK;
    char ok[64] = "";
    size_t len = 0;
    char scratch[256];
    for (uint32_t n = 1; n <= LLMI_TP_MAX; n++)
        if (splits(m, n, scratch, sizeof scratch) && len + 8 < sizeof ok)
            len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%u", len ? ", " : "", n);
    return llmi_error(LLM_ERR_UNSUPPORTED,
                      "model '%s' cannot run at tensor_parallel %u: %s (sizes that work: %s)",
                      m->name, n_ranks, why, ok);
}

static llmi_weight rows_view(llmi_weight w, uint64_t row0, uint64_t n_rows) {
    if (!w.data)
        return w;
    w.data = (const uint8_t *)w.data + row0 * w.row_bytes;
    w.rows = (int64_t)n_rows;
    return w;
}

/* A bias (an F32 vector) or any vector's elements [c0, c0 + n). */
static llmi_weight vector_view(llmi_weight w, uint64_t c0, uint64_t n) {
    if (!w.data)
        return w;
    w.data = (const float *)w.data + c0;
    w.cols = (int64_t)n;
    w.row_bytes = n * sizeof(float);
    return w;
}

/* Columns [c0, c0 + n) of w in a buffer of its own (*owned); c0 and n are
 * multiples of the type's block (llmi_tp_check). */
static llm_status cols_copy(llmi_weight *w, uint64_t c0, uint64_t n, void **owned) {
    const llmi_ttype_info *ti = llmi_ttype_get(w->type);
    const size_t row_bytes = llmi_ttype_row_bytes(w->type, n);
    size_t total;
    if (!ti || row_bytes == 0 || !llmi_mul_ok((size_t)w->rows, row_bytes, &total))
        return llmi_error(LLM_ERR_INVALID_ARGUMENT,
                          "tensor-parallel slice of %" PRIu64 " columns of a %s weight", n,
                          ti ? ti->name : "?");
    uint8_t *buf = llmi_malloc_aligned(total ? total : 1);
    if (!buf)
        return llmi_oom("tensor-parallel weight slice");
    const size_t skip = (size_t)(c0 / ti->block) * ti->block_bytes;
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(buf + (size_t)r * row_bytes,
               (const uint8_t *)w->data + (size_t)r * w->row_bytes + skip, row_bytes);
    w->data = buf;
    w->cols = (int64_t)n;
    w->row_bytes = row_bytes;
    *owned = buf;
    return LLM_OK;
}

void llmi_tp_weights_free(llmi_tp_weights *w) {
    if (!w)
        return;
    for (size_t i = 0; w->owned && i < w->n_owned; i++)
        llmi_free_aligned(w->owned[i]);
    llmi_free(w->owned);
    for (uint32_t r = 0; r < w->n_ranks; r++)
        llmi_free(w->shard[r].layers);
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
    w->owned = llmi_calloc((size_t)n_ranks * hp->n_layer * 2 + 1, sizeof *w->owned);
    if (!w->owned)
        goto oom;
    const uint32_t hq = hp->n_head / n_ranks, ff = hp->n_ff / n_ranks, hd = hp->head_dim;
    llm_status st = LLM_OK;
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
        s->hp.n_ff = ff;
        w->vocab0[r] = (uint32_t)((uint64_t)hp->n_vocab * r / n_ranks);
        s->hp.n_vocab = (uint32_t)((uint64_t)hp->n_vocab * (r + 1) / n_ranks) - w->vocab0[r];
        s->w[LLMI_ROLE_OUTPUT] = rows_view(m->w[LLMI_ROLE_OUTPUT], w->vocab0[r], s->hp.n_vocab);
        const uint64_t q0 = (uint64_t)r * hq * hd, kvd0 = (uint64_t)kv0 * hd;
        const uint64_t nq = (uint64_t)hq * hd, nkv = (uint64_t)n_kv * hd, f0 = (uint64_t)r * ff;
        for (uint32_t l = 0; l < hp->n_layer; l++) {
            const llmi_weight *src = m->layers[l].w;
            llmi_weight *dst = s->layers[l].w;
            memcpy(dst, src, sizeof s->layers[l].w);
            dst[LLMI_ROLE_Q] = rows_view(src[LLMI_ROLE_Q], q0, nq);
            dst[LLMI_ROLE_K] = rows_view(src[LLMI_ROLE_K], kvd0, nkv);
            dst[LLMI_ROLE_V] = rows_view(src[LLMI_ROLE_V], kvd0, nkv);
            dst[LLMI_ROLE_Q_BIAS] = vector_view(src[LLMI_ROLE_Q_BIAS], q0, nq);
            dst[LLMI_ROLE_K_BIAS] = vector_view(src[LLMI_ROLE_K_BIAS], kvd0, nkv);
            dst[LLMI_ROLE_V_BIAS] = vector_view(src[LLMI_ROLE_V_BIAS], kvd0, nkv);
            dst[LLMI_ROLE_GATE] = rows_view(src[LLMI_ROLE_GATE], f0, ff);
            dst[LLMI_ROLE_UP] = rows_view(src[LLMI_ROLE_UP], f0, ff);
            /* The fused tensors stay whole: the step reads only their views. */
            if ((st = cols_copy(&dst[LLMI_ROLE_O], q0, nq, &w->owned[w->n_owned++])) != LLM_OK ||
                (st = cols_copy(&dst[LLMI_ROLE_DOWN], f0, ff, &w->owned[w->n_owned++])) != LLM_OK) {
                llmi_tp_weights_free(w);
                return st;
            }
        }
    }
    *out = w;
    return LLM_OK;
oom:
    llmi_tp_weights_free(w);
    return llmi_oom("tensor-parallel weight shards");
}
