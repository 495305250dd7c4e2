/* The shard arithmetic of GPU tensor parallelism (tp.h): which heads,
 * features and vocabulary rows each rank holds, whether a model splits,
 * the column repack of the row-parallel weights, and the host-side
 * assembly of logits and K/V rows. No CUDA call and no core function: the
 * plug-in links without the core, and the host test runs these. */
#include "layout.h"
#include "tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool llmi_cuda_tp_type_block(llmi_ttype type, uint32_t *block, uint32_t *block_bytes) {
    uint32_t b = 1, bytes;
    switch (type) {
    case LLMI_T_F32:
        bytes = 4;
        break;
    case LLMI_T_F16:
    case LLMI_T_BF16:
        bytes = 2;
        break;
    case LLMI_T_Q4_0:
        b = LLMI_QK, bytes = sizeof(llmi_block_q4_0);
        break;
    case LLMI_T_Q4_1:
        b = LLMI_QK, bytes = sizeof(llmi_block_q4_1);
        break;
    case LLMI_T_Q5_0:
        b = LLMI_QK, bytes = sizeof(llmi_block_q5_0);
        break;
    case LLMI_T_Q5_1:
        b = LLMI_QK, bytes = sizeof(llmi_block_q5_1);
        break;
    case LLMI_T_Q8_0:
        b = LLMI_QK, bytes = sizeof(llmi_block_q8_0);
        break;
    case LLMI_T_Q8_1:
        b = LLMI_QK, bytes = sizeof(llmi_block_q8_1);
        break;
    case LLMI_T_Q4_K:
        b = LLMI_QK_K, bytes = sizeof(llmi_block_q4_k);
        break;
    case LLMI_T_Q6_K:
        b = LLMI_QK_K, bytes = sizeof(llmi_block_q6_k);
        break;
    case LLMI_T_Q8_K:
        b = LLMI_QK_K, bytes = sizeof(llmi_block_q8_k);
        break;
    default:
        return false;
    }
    *block = b;
    *block_bytes = bytes;
    return true;
}

void llmi_cuda_tp_slice(uint32_t full, uint32_t n, uint32_t r, uint32_t *begin, uint32_t *end) {
    *begin = (uint32_t)((uint64_t)full * r / n);
    *end = (uint32_t)((uint64_t)full * (r + 1) / n);
}

void llmi_cuda_tp_kv_heads(uint32_t n_head_kv, uint32_t n, uint32_t r, uint32_t *kv0,
                           uint32_t *n_kv) {
    if (n_head_kv % n == 0) {
        *n_kv = n_head_kv / n;
        *kv0 = r * *n_kv;
    } else {
        /* n a multiple of n_head_kv: rank r's query heads all read KV head
         * r * n_head_kv / n, the one it holds. */
        *n_kv = 1;
        *kv0 = r * n_head_kv / n;
    }
}

void llmi_cuda_tp_shard_of(const llmi_hparams *hp, uint32_t n, uint32_t r,
                           llmi_cuda_tp_shard *out) {
    uint32_t end;
    out->n_head = hp->n_head / n;
    out->head0 = r * out->n_head;
    llmi_cuda_tp_kv_heads(hp->n_head_kv, n, r, &out->kv0, &out->n_kv);
    llmi_cuda_tp_slice(hp->n_ff, n, r, &out->ff0, &end);
    out->n_ff = end - out->ff0;
    llmi_cuda_tp_slice(hp->n_vocab, n, r, &out->vocab0, &end);
    out->n_vocab = end - out->vocab0;
}

uint32_t llmi_cuda_tp_kv_owner(uint32_t n_head_kv, uint32_t n, uint32_t head) {
    if (n_head_kv % n == 0)
        return head / (n_head_kv / n);
    return head * (n / n_head_kv);
}

/* Whether every rank's columns [c0, c0 + n_cols) of a weight of `type`
 * fall on its blocks; names the first that does not in why. */
static bool cols_on_blocks(const llmi_weight *w, const char *name, uint32_t n, const uint32_t *c0,
                           const uint32_t *n_cols, char *why, size_t cap) {
    uint32_t block, bytes;
    char tbuf[24];
    if (!w->data)
        return true;
    if (!llmi_cuda_tp_type_block(w->type, &block, &bytes)) {
        snprintf(why, cap, "%s has a type the split does not know (%s)", name,
                 llmi_cuda_type_name(w->type, tbuf, sizeof tbuf));
        return false;
    }
    for (uint32_t r = 0; r < n; r++)
        if (c0[r] % block || n_cols[r] % block) {
            snprintf(why, cap,
                     "rank %u's input columns [%u, %u) of %s (%s, blocks of %u) do not fall on "
                     "block boundaries",
                     r, c0[r], c0[r] + n_cols[r], name,
                     llmi_cuda_type_name(w->type, tbuf, sizeof tbuf), block);
            return false;
        }
    return true;
}

static bool splits(const llm_model *m, uint32_t n, char *why, size_t cap) {
    const llmi_hparams *hp = &m->hp;
    if (n == 1)
        return true;
    if (hp->n_head % n) {
        snprintf(why, cap, "%u attention heads do not split in %u", hp->n_head, n);
        return false;
    }
    if (hp->n_head_kv == 0 || (hp->n_head_kv % n && n % hp->n_head_kv)) {
        snprintf(why, cap, "%u KV heads neither split in %u nor replicate to %u", hp->n_head_kv, n,
                 n);
        return false;
    }
    if (hp->n_ff < n || hp->n_vocab < n) {
        snprintf(why, cap, "%u FFN features or %u vocabulary rows do not split in %u", hp->n_ff,
                 hp->n_vocab, n);
        return false;
    }
    uint32_t o0[LLMI_CUDA_TP_MAX], on[LLMI_CUDA_TP_MAX], f0[LLMI_CUDA_TP_MAX], fn[LLMI_CUDA_TP_MAX];
    for (uint32_t r = 0; r < n; r++) {
        llmi_cuda_tp_shard sh;
        llmi_cuda_tp_shard_of(hp, n, r, &sh);
        o0[r] = sh.head0 * hp->head_dim;
        on[r] = sh.n_head * hp->head_dim;
        f0[r] = sh.ff0;
        fn[r] = sh.n_ff;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%u.attn_output.weight", l);
        if (!cols_on_blocks(&m->layers[l].w[LLMI_ROLE_O], name, n, o0, on, why, cap))
            return false;
        snprintf(name, sizeof name, "blk.%u.ffn_down.weight", l);
        if (!cols_on_blocks(&m->layers[l].w[LLMI_ROLE_DOWN], name, n, f0, fn, why, cap))
            return false;
    }
    return true;
}

llm_status llmi_cuda_tp_check(const llm_model *m, uint32_t n, char *why, size_t cap) {
    char ok[64] = "", scratch[256];
    size_t len = 0;
    for (uint32_t k = 1; k <= LLMI_CUDA_TP_MAX; k++)
        if (splits(m, k, scratch, sizeof scratch) && len + 8 < sizeof ok)
            len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%u", len ? ", " : "", k);
    if (n == 0 || n > LLMI_CUDA_TP_MAX) {
        snprintf(why, cap,
                 "tensor_parallel %u: groups of 1 to %u GPUs are supported (sizes "
                 "that work for model '%s': %s)",
                 n, LLMI_CUDA_TP_MAX, m->name, ok);
        return LLM_ERR_UNSUPPORTED;
    }
    if (splits(m, n, scratch, sizeof scratch))
        return LLM_OK;
    snprintf(why, cap,
             "model '%s' cannot run at tensor_parallel %u on GPUs: %s (sizes that work: "
             "%s)",
             m->name, n, scratch, ok);
    return LLM_ERR_UNSUPPORTED;
}

size_t llmi_cuda_tp_cols_row_bytes(llmi_ttype type, uint32_t n_cols) {
    uint32_t block, bytes;
    if (!llmi_cuda_tp_type_block(type, &block, &bytes) || n_cols % block)
        return 0;
    return (size_t)(n_cols / block) * bytes;
}

bool llmi_cuda_tp_repack_cols(const llmi_weight *w, uint32_t c0, uint32_t n_cols, void *dst) {
    uint32_t block, bytes;
    if (!llmi_cuda_tp_type_block(w->type, &block, &bytes) || c0 % block || n_cols % block ||
        (uint64_t)c0 + n_cols > (uint64_t)w->cols)
        return false;
    const size_t from = (size_t)(c0 / block) * bytes, len = (size_t)(n_cols / block) * bytes;
    for (int64_t i = 0; i < w->rows; i++)
        memcpy((char *)dst + (size_t)i * len,
               (const char *)w->data + (size_t)i * w->row_bytes + from, len);
    return true;
}

/* A column slice's shape, its data at `data`. */
static llmi_weight cols_view(llmi_weight w, uint32_t n_cols, const void *data) {
    w.data = data;
    w.cols = n_cols;
    w.row_bytes = llmi_cuda_tp_cols_row_bytes(w.type, n_cols);
    return w;
}

void llmi_cuda_tp_rank_free(llmi_cuda_tp_rank *rk) {
    if (!rk)
        return;
    free(rk->m.layers);
    free(rk->host);
    memset(rk, 0, sizeof *rk);
}

/* Host bytes of the repacked O and down slices of one rank. */
static bool repack_bytes(const llm_model *m, const llmi_cuda_tp_shard *sh, size_t *out) {
    const llmi_hparams *hp = &m->hp;
    size_t total = 0, o, d;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const llmi_weight *wo = &m->layers[l].w[LLMI_ROLE_O], *wd = &m->layers[l].w[LLMI_ROLE_DOWN];
        if (!llmi_mul_ok((size_t)wo->rows,
                         llmi_cuda_tp_cols_row_bytes(wo->type, sh->n_head * hp->head_dim), &o) ||
            !llmi_mul_ok((size_t)wd->rows, llmi_cuda_tp_cols_row_bytes(wd->type, sh->n_ff), &d) ||
            o > SIZE_MAX - total || d > SIZE_MAX - total - o)
            return false;
        total += (wo->data ? o : 0) + (wd->data ? d : 0);
    }
    *out = total;
    return true;
}

llm_status llmi_cuda_tp_rank_make(const llm_model *m, uint32_t n, uint32_t r,
                                  llmi_cuda_tp_rank *out) {
    memset(out, 0, sizeof *out);
    const llmi_hparams *hp = &m->hp;
    llmi_cuda_tp_shard *sh = &out->shard;
    llmi_cuda_tp_shard_of(hp, n, r, sh);
    size_t host_bytes;
    if (!repack_bytes(m, sh, &host_bytes))
        return LLM_ERR_LIMIT;
    llm_model *s = &out->m;
    *s = *m;
    s->hp.n_head = sh->n_head;
    s->hp.n_head_kv = sh->n_kv;
    s->hp.n_ff = sh->n_ff;
    s->hp.n_vocab = sh->n_vocab;
    s->layers = calloc(hp->n_layer ? hp->n_layer : 1, sizeof *s->layers);
    out->host = malloc(host_bytes ? host_bytes : 1);
    if (!s->layers || !out->host) {
        llmi_cuda_tp_rank_free(out);
        return LLM_ERR_OUT_OF_MEMORY;
    }
    s->w[LLMI_ROLE_OUTPUT] = llmi_weight_rows(m->w[LLMI_ROLE_OUTPUT], sh->vocab0, sh->n_vocab);
    const uint64_t hd = hp->head_dim, q0 = sh->head0 * hd, nq = sh->n_head * hd;
    const uint64_t k0 = sh->kv0 * hd, nk = sh->n_kv * hd;
    char *at = out->host;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        const llmi_weight *src = m->layers[l].w;
        llmi_weight *dst = s->layers[l].w;
        memcpy(dst, src, sizeof s->layers[l].w);
        dst[LLMI_ROLE_Q] = llmi_weight_rows(src[LLMI_ROLE_Q], q0, nq);
        dst[LLMI_ROLE_K] = llmi_weight_rows(src[LLMI_ROLE_K], k0, nk);
        dst[LLMI_ROLE_V] = llmi_weight_rows(src[LLMI_ROLE_V], k0, nk);
        dst[LLMI_ROLE_Q_BIAS] = llmi_weight_elems(src[LLMI_ROLE_Q_BIAS], q0, nq);
        dst[LLMI_ROLE_K_BIAS] = llmi_weight_elems(src[LLMI_ROLE_K_BIAS], k0, nk);
        dst[LLMI_ROLE_V_BIAS] = llmi_weight_elems(src[LLMI_ROLE_V_BIAS], k0, nk);
        dst[LLMI_ROLE_GATE] = llmi_weight_rows(src[LLMI_ROLE_GATE], sh->ff0, sh->n_ff);
        dst[LLMI_ROLE_UP] = llmi_weight_rows(src[LLMI_ROLE_UP], sh->ff0, sh->n_ff);
        const struct {
            int role;
            uint32_t c0, n_cols;
        } cut[2] = {{LLMI_ROLE_O, (uint32_t)q0, (uint32_t)nq}, {LLMI_ROLE_DOWN, sh->ff0, sh->n_ff}};
        for (int i = 0; i < 2; i++) {
            const llmi_weight *w = &src[cut[i].role];
            if (!w->data)
                continue;
            dst[cut[i].role] = cols_view(*w, cut[i].n_cols, at);
            if (!llmi_cuda_tp_repack_cols(w, cut[i].c0, cut[i].n_cols, at)) {
                llmi_cuda_tp_rank_free(out);
                return LLM_ERR_UNSUPPORTED; /* llmi_cuda_tp_check was not called */
            }
            at += (size_t)w->rows * dst[cut[i].role].row_bytes;
        }
    }
    return LLM_OK;
}

void llmi_cuda_tp_rank_release_host(llmi_cuda_tp_rank *rk, const llm_model *m) {
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        llmi_weight *w = rk->m.layers[l].w;
        if (w[LLMI_ROLE_O].data)
            w[LLMI_ROLE_O].data = m->layers[l].w[LLMI_ROLE_O].data;
        if (w[LLMI_ROLE_DOWN].data)
            w[LLMI_ROLE_DOWN].data = m->layers[l].w[LLMI_ROLE_DOWN].data;
    }
    free(rk->host);
    rk->host = NULL;
}

void llmi_cuda_tp_place_logits(float *out, uint32_t n_rows, uint32_t n_vocab, uint32_t vocab0,
                               uint32_t n_slice, const float *slice) {
    for (uint32_t i = 0; i < n_rows; i++)
        memcpy(out + (size_t)i * n_vocab + vocab0, slice + (size_t)i * n_slice,
               (size_t)n_slice * sizeof *out);
}

void llmi_cuda_tp_kv_gather(const void *full, uint32_t n, uint32_t n_head_kv, size_t head_bytes,
                            uint32_t kv0, uint32_t n_kv, void *part) {
    for (uint32_t i = 0; i < n; i++)
        memcpy((char *)part + (size_t)i * n_kv * head_bytes,
               (const char *)full + ((size_t)i * n_head_kv + kv0) * head_bytes,
               (size_t)n_kv * head_bytes);
}

void llmi_cuda_tp_kv_scatter(const void *part, uint32_t n, uint32_t n_head_kv, size_t head_bytes,
                             uint32_t kv0, uint32_t n_kv, void *full) {
    for (uint32_t i = 0; i < n; i++)
        memcpy((char *)full + ((size_t)i * n_head_kv + kv0) * head_bytes,
               (const char *)part + (size_t)i * n_kv * head_bytes, (size_t)n_kv * head_bytes);
}
