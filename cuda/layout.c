/* The CUDA backend's sizes and offsets (layout.h). No CUDA call and no
 * core function: the plug-in links without the core, and the host test
 * runs these without a GPU. */
#include "layout.h"

#include <stdio.h>
#include <string.h>

bool llmi_cuda_arena_add(size_t *size, size_t bytes, size_t *offset) {
    size_t at = *size;
    if (at > SIZE_MAX - (LLMI_CUDA_ALIGN - 1))
        return false;
    at = (at + LLMI_CUDA_ALIGN - 1) / LLMI_CUDA_ALIGN * LLMI_CUDA_ALIGN;
    if (bytes > SIZE_MAX - at)
        return false;
    *offset = at;
    *size = at + bytes;
    return true;
}

static const char *const layer_names[LLMI_LAYER_ROLES] = {
    [LLMI_ROLE_ATTN_NORM] = "blk.%u.attn_norm.weight",
    [LLMI_ROLE_Q] = "blk.%u.attn_q.weight",
    [LLMI_ROLE_K] = "blk.%u.attn_k.weight",
    [LLMI_ROLE_V] = "blk.%u.attn_v.weight",
    [LLMI_ROLE_Q_BIAS] = "blk.%u.attn_q.bias",
    [LLMI_ROLE_K_BIAS] = "blk.%u.attn_k.bias",
    [LLMI_ROLE_V_BIAS] = "blk.%u.attn_v.bias",
    [LLMI_ROLE_Q_NORM] = "blk.%u.attn_q_norm.weight",
    [LLMI_ROLE_K_NORM] = "blk.%u.attn_k_norm.weight",
    [LLMI_ROLE_O] = "blk.%u.attn_output.weight",
    [LLMI_ROLE_POST_ATTN_NORM] = "blk.%u.post_attention_norm.weight",
    [LLMI_ROLE_FFN_NORM] = "blk.%u.ffn_norm.weight",
    [LLMI_ROLE_GATE] = "blk.%u.ffn_gate.weight",
    [LLMI_ROLE_UP] = "blk.%u.ffn_up.weight",
    [LLMI_ROLE_DOWN] = "blk.%u.ffn_down.weight",
    [LLMI_ROLE_POST_FFN_NORM] = "blk.%u.post_ffw_norm.weight",
};

static const char *const model_names[LLMI_MODEL_ROLES] = {
    [LLMI_ROLE_TOKEN_EMBD] = "token_embd.weight",
    [LLMI_ROLE_OUTPUT_NORM] = "output_norm.weight",
    [LLMI_ROLE_OUTPUT] = "output.weight",
    [LLMI_ROLE_ROPE_FREQS] = "rope_freqs.weight",
    [LLMI_ROLE_ROPE_FACTORS_LONG] = "rope_factors_long.weight",
    [LLMI_ROLE_ROPE_FACTORS_SHORT] = "rope_factors_short.weight",
    /* encoders' (refused by llmi_cuda_model_check): named for messages only */
    [LLMI_ROLE_POS_EMBD] = "position_embd.weight",
    [LLMI_ROLE_TOKEN_TYPES] = "token_types.weight",
    [LLMI_ROLE_TOKEN_EMBD_NORM] = "token_embd_norm.weight",
    [LLMI_ROLE_TOKEN_EMBD_NORM_BIAS] = "token_embd_norm.bias",
};

bool llmi_cuda_layer_role_used(int role) {
    return role >= 0 && role < LLMI_LAYER_ROLES && layer_names[role] != NULL;
}

const char *llmi_cuda_layer_role_name(int role) {
    return llmi_cuda_layer_role_used(role) ? layer_names[role] : NULL;
}

const char *llmi_cuda_model_role_name(int role) {
    return role >= 0 && role < LLMI_MODEL_ROLES ? model_names[role] : NULL;
}

const char *llmi_cuda_type_name(llmi_ttype type, char *buf, size_t cap) {
    switch (type) {
    case LLMI_T_F32:
        return "F32";
    case LLMI_T_F16:
        return "F16";
    case LLMI_T_BF16:
        return "BF16";
    case LLMI_T_Q4_0:
        return "Q4_0";
    case LLMI_T_Q4_1:
        return "Q4_1";
    case LLMI_T_Q5_0:
        return "Q5_0";
    case LLMI_T_Q5_1:
        return "Q5_1";
    case LLMI_T_Q8_0:
        return "Q8_0";
    case LLMI_T_Q8_1:
        return "Q8_1";
    case LLMI_T_Q4_K:
        return "Q4_K";
    case LLMI_T_Q6_K:
        return "Q6_K";
    case LLMI_T_Q8_K:
        return "Q8_K";
    case LLMI_T_FP8_E4M3:
        return "FP8_E4M3";
    }
    snprintf(buf, cap, "type %d", (int)type);
    return buf;
}

static bool is_vector_role(int role) {
    switch (role) {
    case LLMI_ROLE_ATTN_NORM:
    case LLMI_ROLE_Q_BIAS:
    case LLMI_ROLE_K_BIAS:
    case LLMI_ROLE_V_BIAS:
    case LLMI_ROLE_Q_NORM:
    case LLMI_ROLE_K_NORM:
    case LLMI_ROLE_POST_ATTN_NORM:
    case LLMI_ROLE_FFN_NORM:
    case LLMI_ROLE_POST_FFN_NORM:
        return true;
    default:
        return false;
    }
}

/* Checks one present weight: matrices in a type the kernels take, vectors
 * F32. `name` is the tensor's GGUF name. */
static llm_status check_weight(const llmi_weight *w, bool vector, const char *name,
                               bool (*type_ok)(llmi_ttype), char *why, size_t cap) {
    char tbuf[24];
    if (vector ? w->type != LLMI_T_F32 : !type_ok(w->type)) {
        snprintf(why, cap, "the CUDA backend cannot use tensor %s of type %s%s", name,
                 llmi_cuda_type_name(w->type, tbuf, sizeof tbuf),
                 vector ? " (vectors must be F32)"
                        : " (it takes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K)");
        return LLM_ERR_UNSUPPORTED;
    }
    return LLM_OK;
}

llm_status llmi_cuda_model_check(const llm_model *m, bool (*type_ok)(llmi_ttype), char *why,
                                 size_t cap) {
    const llmi_hparams *hp = &m->hp;
    const llmi_features *f = &hp->features;
    if (f->encoder) {
        snprintf(why, cap,
                 "the CUDA backend does not implement encoder models (%s: bidirectional "
                 "attention, learned positions, post-LayerNorm blocks); use the CPU backend",
                 hp->arch);
        return LLM_ERR_UNSUPPORTED;
    }
    if (f->norm != LLMI_NORM_RMS) {
        snprintf(why, cap, "the CUDA backend does not implement LayerNorm models");
        return LLM_ERR_UNSUPPORTED;
    }
    if (f->attn_softcap != 0.0f) {
        snprintf(why, cap, "the CUDA backend does not implement attention soft-caps (cap %g)",
                 (double)f->attn_softcap);
        return LLM_ERR_UNSUPPORTED;
    }
    if (f->n_expert) {
        snprintf(why, cap,
                 "the CUDA backend does not implement mixture-of-experts layers (%u experts)",
                 f->n_expert);
        return LLM_ERR_UNSUPPORTED;
    }
    if (m->w[LLMI_ROLE_ROPE_FACTORS_LONG].data || m->w[LLMI_ROLE_ROPE_FACTORS_SHORT].data) {
        snprintf(why, cap, "the CUDA backend does not implement LongRoPE factors");
        return LLM_ERR_UNSUPPORTED;
    }
    if (hp->rope_dim % 2 || hp->rope_dim > hp->head_dim || hp->n_head_kv == 0 ||
        hp->n_head % hp->n_head_kv) {
        snprintf(why, cap, "the CUDA backend cannot run rope_dim %u, head_dim %u, %u/%u heads",
                 hp->rope_dim, hp->head_dim, hp->n_head, hp->n_head_kv);
        return LLM_ERR_UNSUPPORTED;
    }
    llm_status st;
    for (int r = 0; r < LLMI_MODEL_ROLES; r++) {
        const llmi_weight *w = &m->w[r];
        if (!w->data || r == LLMI_ROLE_ROPE_FACTORS_LONG || r == LLMI_ROLE_ROPE_FACTORS_SHORT)
            continue;
        bool vector = r == LLMI_ROLE_OUTPUT_NORM || r == LLMI_ROLE_ROPE_FREQS;
        if ((st = check_weight(w, vector, model_names[r], type_ok, why, cap)) != LLM_OK)
            return st;
    }
    for (uint32_t l = 0; l < hp->n_layer; l++)
        for (int r = 0; r < LLMI_LAYER_ROLES; r++) {
            const llmi_weight *w = &m->layers[l].w[r];
            if (!w->data || !llmi_cuda_layer_role_used(r))
                continue;
            char name[64];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
            snprintf(name, sizeof name, layer_names[r], l);
#pragma GCC diagnostic pop
            if ((st = check_weight(w, is_vector_role(r), name, type_ok, why, cap)) != LLM_OK)
                return st;
        }
    return LLM_OK;
}

size_t llmi_cuda_weight_slots(const llm_model *m) {
    return LLMI_MODEL_ROLES + (size_t)m->hp.n_layer * LLMI_LAYER_ROLES;
}

const llmi_weight *llmi_cuda_weight_at(const llm_model *m, size_t slot) {
    if (slot < LLMI_MODEL_ROLES)
        return m->w[slot].data ? &m->w[slot] : NULL;
    slot -= LLMI_MODEL_ROLES;
    size_t l = slot / LLMI_LAYER_ROLES;
    int r = (int)(slot % LLMI_LAYER_ROLES);
    if (l >= m->hp.n_layer || !llmi_cuda_layer_role_used(r))
        return NULL;
    return m->layers[l].w[r].data ? &m->layers[l].w[r] : NULL;
}

static bool weight_bytes(const llmi_weight *w, size_t *out) {
    return w->rows >= 0 && llmi_mul_ok((size_t)w->rows, w->row_bytes, out);
}

bool llmi_cuda_weights_plan(const llm_model *m, size_t *offsets, size_t *total) {
    const size_t n = llmi_cuda_weight_slots(m);
    size_t size = 0;
    for (size_t i = 0; i < n; i++) {
        offsets[i] = SIZE_MAX;
        const llmi_weight *w = llmi_cuda_weight_at(m, i);
        if (!w || i == LLMI_ROLE_ROPE_FACTORS_LONG || i == LLMI_ROLE_ROPE_FACTORS_SHORT)
            continue;
        /* The tied output is the embedding itself: one copy on the device. */
        if (i == LLMI_ROLE_OUTPUT && w->data == m->w[LLMI_ROLE_TOKEN_EMBD].data) {
            offsets[i] = offsets[LLMI_ROLE_TOKEN_EMBD];
            continue;
        }
        size_t bytes;
        if (!weight_bytes(w, &bytes) || !llmi_cuda_arena_add(&size, bytes, &offsets[i]))
            return false;
    }
    *total = size;
    return true;
}

uint32_t llmi_cuda_chunk_rows(uint32_t rows, uint32_t cols, size_t elem_bytes, size_t scratch) {
    size_t row_bytes;
    if (!llmi_mul_ok(cols, elem_bytes, &row_bytes) || row_bytes == 0)
        return 0;
    size_t fit = scratch / row_bytes;
    if (fit >= rows)
        return rows;
    fit -= fit % LLMI_CUDA_CHUNK_ROWS;
    return (uint32_t)fit;
}

/* Grows *need to the scratch bytes matrix w needs: its chunks of at least
 * LLMI_CUDA_CHUNK_ROWS rows in f32 (or all of it), up to the cap. */
static bool deq_need(const llmi_weight *w, size_t *need) {
    size_t whole, min_chunk;
    if (!llmi_mul_ok((size_t)w->rows, (size_t)w->cols * 4, &whole) ||
        !llmi_mul_ok(LLMI_CUDA_CHUNK_ROWS, (size_t)w->cols * 4, &min_chunk))
        return false;
    size_t b = min_chunk > LLMI_CUDA_DEQUANT_CAP ? min_chunk : LLMI_CUDA_DEQUANT_CAP;
    b = whole < b ? whole : b;
    *need = b > *need ? b : *need;
    return true;
}

/* Scratch bytes of dequantized rows for every matrix the step multiplies
 * on the tensor-core path. */
static bool deq_bytes(const llm_model *m, size_t *out) {
    size_t need = 0;
    const size_t n = llmi_cuda_weight_slots(m);
    for (size_t i = 0; i < n; i++) {
        const llmi_weight *w = llmi_cuda_weight_at(m, i);
        bool matrix = w && (i >= LLMI_MODEL_ROLES
                                ? !is_vector_role((int)((i - LLMI_MODEL_ROLES) % LLMI_LAYER_ROLES))
                                : i == LLMI_ROLE_OUTPUT);
        if (matrix && !deq_need(w, &need))
            return false;
    }
    *out = need;
    return true;
}

static bool add_rows(size_t *size, uint32_t rows, uint32_t dim, size_t elem, size_t *offset) {
    size_t n;
    return llmi_mul_ok((size_t)rows * dim, elem, &n) && llmi_cuda_arena_add(size, n, offset);
}

bool llmi_cuda_stack_rows(const llmi_cu_matrix *const *parts, size_t n, llmi_cu_matrix *out) {
    if (n == 0 || !parts[0]->data)
        return false;
    llmi_cu_matrix v = *parts[0];
    for (size_t i = 1; i < n; i++) {
        const llmi_cu_matrix *p = parts[i];
        const char *end = (const char *)v.data + (size_t)v.rows * v.row_bytes;
        if (!p->data || p->type != v.type || p->cols != v.cols || p->row_bytes != v.row_bytes ||
            (const char *)p->data != end || p->rows > UINT32_MAX - v.rows)
            return false;
        v.rows += p->rows;
    }
    *out = v;
    return true;
}

bool llmi_cuda_join_vectors(const llmi_cu_matrix *const *parts, size_t n, llmi_cu_matrix *out) {
    size_t present = 0;
    for (size_t i = 0; i < n; i++)
        present += parts[i]->data != NULL;
    if (present == 0) {
        *out = (llmi_cu_matrix){0};
        return true;
    }
    if (present != n)
        return false;
    llmi_cu_matrix v = *parts[0];
    if (v.type != LLMI_T_F32 || v.rows != 1)
        return false;
    for (size_t i = 1; i < n; i++) {
        const llmi_cu_matrix *p = parts[i];
        const char *end = (const char *)v.data + (size_t)v.cols * sizeof(float);
        if (p->type != LLMI_T_F32 || p->rows != 1 || (const char *)p->data != end ||
            p->cols > UINT32_MAX - v.cols)
            return false;
        v.cols += p->cols;
    }
    v.row_bytes = (size_t)v.cols * sizeof(float);
    *out = v;
    return true;
}

bool llmi_cuda_scratch_plan(const llm_model *m, uint32_t max_rows, size_t attn_floats,
                            bool batch_invariant, llmi_cuda_scratch *out) {
    const llmi_hparams *hp = &m->hp;
    llmi_cuda_scratch s = {0};
    const uint32_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    size_t logit_rows = LLMI_CUDA_LOGITS_CAP / ((size_t)hp->n_vocab * sizeof(float));
    if (logit_rows < 1)
        logit_rows = 1;
    if (logit_rows > max_rows)
        logit_rows = max_rows;
    s.logit_rows = (uint32_t)logit_rows;
    size_t size = 0, attn_bytes;
    bool ok =
        add_rows(&size, max_rows, hp->n_embd, 4, &s.x) &&
        add_rows(&size, max_rows, hp->n_embd, 4, &s.xb) &&
        add_rows(&size, max_rows, q_dim + 2 * kv_dim, 4, &s.q) &&
        add_rows(&size, max_rows, kv_dim, 4, &s.k) && add_rows(&size, max_rows, kv_dim, 4, &s.v) &&
        add_rows(&size, max_rows, q_dim, 4, &s.att) &&
        add_rows(&size, max_rows, hp->n_ff, 4, &s.gate) &&
        add_rows(&size, max_rows, hp->n_ff, 4, &s.up) &&
        add_rows(&size, max_rows, hp->n_embd, 4, &s.hout) &&
        add_rows(&size, s.logit_rows, hp->n_embd, 4, &s.out_rows) &&
        add_rows(&size, s.logit_rows, hp->n_vocab, 4, &s.logits) &&
        llmi_mul_ok(attn_floats, 4, &attn_bytes) && llmi_cuda_arena_add(&size, attn_bytes, &s.attn);
    if (!ok)
        return false;
    s.gemm = batch_invariant || !llmi_cuda_use_gemv(max_rows);
    if (s.gemm) {
        uint32_t widest = hp->n_embd > q_dim ? hp->n_embd : q_dim;
        widest = hp->n_ff > widest ? hp->n_ff : widest;
        if (!add_rows(&size, max_rows, widest, 2, &s.act))
            return false;
        /* The batch-invariant matmul reads every weight where it lies. */
        if (!batch_invariant &&
            (!deq_bytes(m, &s.deq_bytes) || !llmi_cuda_arena_add(&size, s.deq_bytes, &s.deq)))
            return false;
    }
    s.size = size;
    *out = s;
    return true;
}

uint32_t llmi_cuda_max_pos(const uint32_t *pos, uint32_t n_rows) {
    uint32_t max = 0;
    for (uint32_t r = 0; r < n_rows; r++)
        max = pos[r] > max ? pos[r] : max;
    return max;
}

/* Rows from r on that continue row r's run: same sequence, next position. */
static uint32_t run_length(const uint32_t *pos, const uint32_t *seq, uint32_t n_rows, uint32_t r) {
    uint32_t e = r + 1;
    while (e < n_rows && seq[e] == seq[e - 1] && (uint64_t)pos[e] == (uint64_t)pos[e - 1] + 1)
        e++;
    return e - r;
}

void llmi_cuda_prefill_plan(const uint32_t *pos, const uint32_t *seq, uint32_t n_rows,
                            uint32_t head_dim, uint32_t *tiles, uint32_t *n_tiles, uint32_t *decode,
                            uint32_t *n_decode) {
    const bool fits = head_dim <= LLMI_CU_PREFILL_MAX_HEAD_DIM;
    uint32_t nt = 0, nd = 0;
    for (uint32_t r = 0; r < n_rows;) {
        const uint32_t len = run_length(pos, seq, n_rows, r);
        if (fits && len >= LLMI_CU_PREFILL_MIN_ROWS) {
            for (uint32_t t = 0; t < len; t += LLMI_CU_PREFILL_TILE) {
                tiles[2 * nt] = r + t;
                tiles[2 * nt + 1] = len - t < LLMI_CU_PREFILL_TILE ? len - t : LLMI_CU_PREFILL_TILE;
                nt++;
            }
        } else {
            for (uint32_t i = 0; i < len; i++)
                decode[nd++] = r + i;
        }
        r += len;
    }
    *n_tiles = nt;
    *n_decode = nd;
}

uint32_t llmi_cuda_graph_rows(uint32_t n_rows, uint32_t max_rows, uint32_t logit_rows) {
    if (n_rows == 0 || n_rows > LLMI_CUDA_GRAPH_MAX_ROWS || n_rows > max_rows)
        return 0;
    uint32_t b = 1;
    while (b < n_rows)
        b *= 2;
    if (b > max_rows)
        b = max_rows;
    return b <= logit_rows ? b : 0;
}

uint32_t llmi_cuda_graph_max_pos(uint32_t max_pos) {
    uint64_t splits = (uint64_t)max_pos / LLMI_CU_ATTN_SPLIT + 1, p2 = 1;
    while (p2 < splits)
        p2 *= 2;
    uint64_t last = p2 * LLMI_CU_ATTN_SPLIT - 1;
    return last > UINT32_MAX ? UINT32_MAX : (uint32_t)last;
}

void llmi_cuda_graph_layout(uint32_t max_rows, uint32_t blocks_cap, llmi_cuda_graph_words *out) {
    const size_t r = max_rows;
    *out = (llmi_cuda_graph_words){.token = 0,
                                   .pos = r,
                                   .seq = 2 * r,
                                   .block_start = 3 * r,
                                   .logit_rows = 4 * r + 2,
                                   .blocks = 5 * r + 2,
                                   .size = 5 * r + 2 + blocks_cap,
                                   .max_rows = max_rows,
                                   .blocks_cap = blocks_cap};
}

bool llmi_cuda_graph_pack(const llmi_step *st, uint32_t rows, uint32_t spare,
                          const llmi_cuda_graph_words *lay, uint32_t *words) {
    const uint32_t n = st->n_rows, n_seqs = st->n_seqs, n_blocks = st->block_start[n_seqs];
    if (rows < n || rows > lay->max_rows || n_seqs > lay->max_rows ||
        (size_t)n_blocks + 1 > lay->blocks_cap)
        return false;
    uint32_t *token = words + lay->token, *pos = words + lay->pos, *seq = words + lay->seq;
    uint32_t *block_start = words + lay->block_start, *blocks = words + lay->blocks;
    uint32_t *logit_rows = words + lay->logit_rows;
    for (uint32_t r = 0; r < rows; r++) {
        token[r] = r < n ? (uint32_t)st->token[r] : 0;
        pos[r] = r < n ? st->pos[r] : 0;
        seq[r] = r < n ? st->seq[r] : n_seqs;
        logit_rows[r] = r < st->n_logits ? st->logit_rows[r] : 0;
    }
    memcpy(block_start, st->block_start, ((size_t)n_seqs + 1) * sizeof *block_start);
    block_start[n_seqs + 1] = n_blocks + 1;
    memcpy(blocks, st->blocks, (size_t)n_blocks * sizeof *blocks);
    blocks[n_blocks] = spare;
    return true;
}
