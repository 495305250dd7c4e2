/* Block pool with reference counts, copy-on-write block tables, and the
 * prefix cache (chained block hashes, a hash index and an LRU list of cached
 * blocks). Everything is allocated by llmi_kv_create; no operation allocates
 * except the growth of a sequence's block table.
 *
 * Per block the pool keeps, besides ref:
 *   flags      HASHED: the block is full and its chain hash is known (hash,
 *              parent, pos and tokens below describe it). REGISTERED: the
 *              block is in the hash index (implies HASHED).
 *   hash       chain hash: H(parent, pos, tokens)
 *   parent     chain hash of the previous block (0 for the first block)
 *   pos        the block's index in the block tables that hold it
 *   tokens     its block_size token ids
 *   lru_prev/next   links of the LRU list (cached blocks only)
 *   chain_next      link of the hash index bucket (registered blocks only)
 * A HASHED block's contents never change: every write goes through
 * llmi_kv_seq_reserve, which copies a shared block and clears the flags of a
 * block held once before handing it out for writing.
 *
 * A match compares hash, parent hash, position and tokens, so two blocks are
 * confused only if two different token prefixes produce the same 64-bit
 * chain hash at some earlier block (a 2^-64 event per pair of prefixes). */
#include "kv/kv.h"

#include <assert.h>

#define NONE UINT32_MAX

enum { F_HASHED = 1, F_REGISTERED = 2 };

struct llmi_kv_index {
    uint64_t *hash, *parent;
    uint32_t *pos;
    llm_token *tokens; /* n_blocks * block_size */
    uint8_t *flags;
    uint32_t *lru_prev, *lru_next;
    uint32_t lru_head, lru_tail; /* head = least recently used */
    uint32_t *chain_next;
    uint32_t *buckets;
    size_t bucket_mask;
    uint32_t n_registered;
#ifdef LLMI_TEST_HOOKS
    uint64_t hash_mask; /* llmi_kv_test_hash_bits; ~0 normally */
#endif
};

/* ---- hashing ---- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Chain hash of a block from its parent's hash, its position and its tokens.
 * Each step is a bijection of the running state for a fixed input word, so
 * no two token blocks of one parent are merged before the final mix. */
static uint64_t block_hash(const llmi_kv *kv, uint64_t parent, uint32_t pos,
                           const llm_token *tokens) {
    const uint64_t g = 0x9e3779b97f4a7c15ull;
    uint64_t h = mix64(parent ^ g) + ((uint64_t)pos + 1) * g;
    uint32_t bs = kv->block_size, i = 0;
    for (; i + 1 < bs; i += 2) {
        uint64_t w = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;
        h = mix64(h + w * g) ^ w;
    }
    if (i < bs)
        h = mix64(h + ((uint64_t)(uint32_t)tokens[i] + 1) * g);
    h = mix64(h ^ bs);
#ifdef LLMI_TEST_HOOKS
    h &= kv->index->hash_mask;
#endif
    return h;
}

static inline llm_token *block_tokens(const llmi_kv *kv, uint32_t b) {
    return kv->index->tokens + (size_t)b * kv->block_size;
}

/* ---- hash index ---- */

static inline size_t bucket_of(const llmi_kv_index *x, uint64_t h) {
    return (size_t)(mix64(h) & x->bucket_mask);
}

/* The registered block with chain hash h, or NONE. */
static uint32_t index_find(const llmi_kv *kv, uint64_t h) {
    const llmi_kv_index *x = kv->index;
    for (uint32_t b = x->buckets[bucket_of(x, h)]; b != NONE; b = x->chain_next[b])
        if (x->hash[b] == h)
            return b;
    return NONE;
}

static void index_insert(llmi_kv *kv, uint32_t b) {
    llmi_kv_index *x = kv->index;
    assert((x->flags[b] & (F_HASHED | F_REGISTERED)) == F_HASHED);
    size_t k = bucket_of(x, x->hash[b]);
    x->chain_next[b] = x->buckets[k];
    x->buckets[k] = b;
    x->flags[b] |= F_REGISTERED;
    x->n_registered++;
}

static void index_remove(llmi_kv *kv, uint32_t b) {
    llmi_kv_index *x = kv->index;
    assert(x->flags[b] & F_REGISTERED);
    uint32_t *link = &x->buckets[bucket_of(x, x->hash[b])];
    while (*link != b) {
        assert(*link != NONE);
        link = &x->chain_next[*link];
    }
    *link = x->chain_next[b];
    x->chain_next[b] = NONE;
    x->flags[b] &= (uint8_t)~F_REGISTERED;
    x->n_registered--;
}

/* ---- LRU list of cached blocks ---- */

static void lru_push_tail(llmi_kv *kv, uint32_t b) {
    llmi_kv_index *x = kv->index;
    x->lru_prev[b] = x->lru_tail;
    x->lru_next[b] = NONE;
    if (x->lru_tail != NONE)
        x->lru_next[x->lru_tail] = b;
    else
        x->lru_head = b;
    x->lru_tail = b;
    kv->n_cached++;
}

static void lru_remove(llmi_kv *kv, uint32_t b) {
    llmi_kv_index *x = kv->index;
    uint32_t p = x->lru_prev[b], n = x->lru_next[b];
    if (p != NONE)
        x->lru_next[p] = n;
    else
        x->lru_head = n;
    if (n != NONE)
        x->lru_prev[n] = p;
    else
        x->lru_tail = p;
    x->lru_prev[b] = x->lru_next[b] = NONE;
    kv->n_cached--;
}

/* ---- block allocation ---- */

/* Takes a block for writing: from the free stack, else the least recently
 * used cached block. The caller has checked llmi_kv_available. */
static uint32_t block_alloc(llmi_kv *kv) {
    llmi_kv_index *x = kv->index;
    uint32_t b;
    if (kv->n_free > 0) {
        b = kv->free_stack[--kv->n_free];
    } else {
        b = x->lru_head;
        assert(b != NONE);
        lru_remove(kv, b);
        index_remove(kv, b);
        kv->evictions++;
    }
    assert(kv->ref[b] == 0);
    x->flags[b] = 0;
    kv->ref[b] = 1;
    return b;
}

static void block_unref(llmi_kv *kv, uint32_t b) {
    llmi_kv_index *x = kv->index;
    assert(kv->ref[b] > 0);
    if (--kv->ref[b] > 0)
        return;
    if (x->flags[b] & F_REGISTERED) {
        lru_push_tail(kv, b);
    } else {
        x->flags[b] = 0;
        kv->free_stack[kv->n_free++] = b;
    }
}

/* ---- pool ---- */

size_t llmi_kv_block_bytes_ex(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size,
                              size_t elem_size) {
    return (size_t)2 * n_layer * kv_dim * block_size * elem_size;
}

size_t llmi_kv_block_bytes_type(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size,
                                llm_kv_type type) {
    return (size_t)2 * n_layer * block_size * llmi_kv_row_bytes(type, kv_dim);
}

size_t llmi_kv_block_bytes(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size) {
    return llmi_kv_block_bytes_ex(n_layer, kv_dim, block_size, sizeof(float));
}

static llm_status index_create(llmi_kv *kv) {
    uint32_t n = kv->n_blocks;
    llmi_kv_index *x = llmi_calloc(1, sizeof *x);
    if (!x)
        return llmi_oom("KV prefix index");
    kv->index = x;
    size_t n_buckets = 1;
    while (n_buckets < n && n_buckets < ((size_t)1 << 31))
        n_buckets *= 2;
    x->bucket_mask = n_buckets - 1;
    x->hash = llmi_malloc((size_t)n * sizeof *x->hash);
    x->parent = llmi_malloc((size_t)n * sizeof *x->parent);
    x->pos = llmi_malloc((size_t)n * sizeof *x->pos);
    x->tokens = llmi_calloc((size_t)n * kv->block_size, sizeof *x->tokens);
    x->flags = llmi_calloc(n, sizeof *x->flags);
    x->lru_prev = llmi_malloc((size_t)n * sizeof *x->lru_prev);
    x->lru_next = llmi_malloc((size_t)n * sizeof *x->lru_next);
    x->chain_next = llmi_malloc((size_t)n * sizeof *x->chain_next);
    x->buckets = llmi_malloc(n_buckets * sizeof *x->buckets);
    if (!x->hash || !x->parent || !x->pos || !x->tokens || !x->flags || !x->lru_prev ||
        !x->lru_next || !x->chain_next || !x->buckets)
        return llmi_oom("KV prefix index");
    for (uint32_t b = 0; b < n; b++) {
        x->hash[b] = x->parent[b] = 0;
        x->pos[b] = 0;
        x->lru_prev[b] = x->lru_next[b] = x->chain_next[b] = NONE;
    }
    for (size_t i = 0; i < n_buckets; i++)
        x->buckets[i] = NONE;
    x->lru_head = x->lru_tail = NONE;
#ifdef LLMI_TEST_HOOKS
    x->hash_mask = ~(uint64_t)0;
#endif
    return LLM_OK;
}

static void index_free(llmi_kv_index *x) {
    if (!x)
        return;
    llmi_free(x->hash);
    llmi_free(x->parent);
    llmi_free(x->pos);
    llmi_free(x->tokens);
    llmi_free(x->flags);
    llmi_free(x->lru_prev);
    llmi_free(x->lru_next);
    llmi_free(x->chain_next);
    llmi_free(x->buckets);
    llmi_free(x);
}

llm_status llmi_kv_create(uint32_t block_size, uint32_t n_blocks, llmi_kv **out) {
    *out = NULL;
    if (block_size == 0 || n_blocks == 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "KV cache with a zero dimension");
    size_t slots, token_bytes;
    if (!llmi_mul_ok(n_blocks, block_size, &slots) ||
        !llmi_mul_ok(slots, sizeof(llm_token), &token_bytes) || slots > UINT32_MAX)
        return llmi_error(LLM_ERR_LIMIT, "KV cache of %u blocks overflows", n_blocks);
    llmi_kv *kv = llmi_calloc(1, sizeof *kv);
    if (!kv)
        return llmi_oom("KV cache");
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    llm_status st = LLM_OK;
    kv->ref = llmi_calloc(n_blocks, sizeof *kv->ref);
    kv->free_stack = llmi_calloc(n_blocks, sizeof *kv->free_stack);
    if (!kv->ref || !kv->free_stack) {
        st = llmi_oom("KV cache blocks");
        goto fail;
    }
    if ((st = index_create(kv)) != LLM_OK)
        goto fail;
    /* Hand out low block ids first: stack top is the end of the array. */
    for (uint32_t i = 0; i < n_blocks; i++)
        kv->free_stack[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    *out = kv;
    return LLM_OK;
fail:
    llmi_kv_free(kv);
    return st;
}

void llmi_kv_set_copier(llmi_kv *kv, llmi_kv_copy_fn copy, void *ctx) {
    kv->copy = copy;
    kv->copy_ctx = ctx;
}

void llmi_kv_free(llmi_kv *kv) {
    if (!kv)
        return;
    llmi_free(kv->ref);
    llmi_free(kv->free_stack);
    index_free(kv->index);
    llmi_free(kv);
}

#ifdef LLMI_TEST_HOOKS
void llmi_kv_test_hash_bits(llmi_kv *kv, unsigned bits) {
    kv->index->hash_mask = bits >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
}
#endif

/* ---- sequences ---- */

static inline uint32_t blocks_for(const llmi_kv *kv, uint32_t n_tokens) {
    return (uint32_t)(((uint64_t)n_tokens + kv->block_size - 1) / kv->block_size);
}

/* Grows seq's table to hold at least `need` entries; false when out of
 * memory (the table is unchanged). */
static bool table_grow(llmi_kv_seq *seq, uint32_t need) {
    if (need <= seq->cap)
        return true;
    uint64_t cap = seq->cap ? seq->cap : 8;
    while (cap < need)
        cap *= 2;
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    uint32_t *t = llmi_realloc(seq->blocks, (size_t)cap * sizeof *t);
    if (!t)
        return false;
    seq->blocks = t;
    seq->cap = (uint32_t)cap;
    return true;
}

uint32_t llmi_kv_seq_blocks_needed(const llmi_kv *kv, const llmi_kv_seq *seq, uint32_t n_tokens) {
    if (n_tokens <= seq->n_tokens)
        return 0;
    uint32_t need = blocks_for(kv, n_tokens);
    uint32_t count = need > seq->n_blocks ? need - seq->n_blocks : 0;
    uint32_t end = need < seq->n_blocks ? need : seq->n_blocks;
    for (uint32_t i = seq->n_tokens / kv->block_size; i < end; i++)
        if (kv->ref[seq->blocks[i]] > 1)
            count++;
    return count;
}

llm_status llmi_kv_seq_reserve(llmi_kv *kv, llmi_kv_seq *seq, uint32_t n_tokens) {
    if (n_tokens <= seq->n_tokens)
        return LLM_OK;
    uint32_t need = blocks_for(kv, n_tokens);
    uint32_t extra = llmi_kv_seq_blocks_needed(kv, seq, n_tokens);
    if (extra > llmi_kv_available(kv))
        return llmi_error(LLM_ERR_LIMIT,
                          "KV cache full: %u tokens need %u more blocks, %u of %u available",
                          n_tokens, extra, llmi_kv_available(kv), kv->n_blocks);
    if (!table_grow(seq, need))
        return llmi_oom("KV block table");
    llmi_kv_index *x = kv->index;
    uint32_t bs = kv->block_size;
    uint32_t end = need < seq->n_blocks ? need : seq->n_blocks;
    /* Blocks that will be written must be private and unregistered. */
    for (uint32_t i = seq->n_tokens / bs; i < end; i++) {
        uint32_t b = seq->blocks[i];
        if (kv->ref[b] > 1) {
            uint32_t nb = block_alloc(kv);
            uint64_t start = (uint64_t)i * bs;
            uint32_t valid = seq->n_tokens > start ? seq->n_tokens - (uint32_t)start : 0;
            llm_status st =
                valid && kv->copy ? kv->copy(kv->copy_ctx, nb, b, valid < bs ? valid : bs) : LLM_OK;
            if (st != LLM_OK) {
                block_unref(kv, nb);
                return st;
            }
            kv->ref[b]--; /* still >= 1: no state change */
            seq->blocks[i] = nb;
            kv->cow_copies++;
        } else {
            if (x->flags[b] & F_REGISTERED)
                index_remove(kv, b);
            x->flags[b] = 0;
        }
    }
    while (seq->n_blocks < need)
        seq->blocks[seq->n_blocks++] = block_alloc(kv);
    return LLM_OK;
}

/* Drops the references of the table entries from index `from` on. */
static void unref_tail(llmi_kv *kv, llmi_kv_seq *seq, uint32_t from) {
    while (seq->n_blocks > from) {
        uint32_t b = seq->blocks[--seq->n_blocks];
        if (b != LLMI_KV_HOLE)
            block_unref(kv, b);
    }
}

void llmi_kv_seq_truncate(llmi_kv *kv, llmi_kv_seq *seq, uint32_t n_tokens) {
    if (n_tokens > seq->n_tokens)
        n_tokens = seq->n_tokens;
    uint32_t first = llmi_kv_seq_first_pos(kv, seq);
    if (n_tokens < first)
        n_tokens = first;
    uint32_t keep = blocks_for(kv, n_tokens);
    unref_tail(kv, seq, keep);
    seq->n_tokens = n_tokens;
    uint32_t full = n_tokens / kv->block_size;
    if (seq->n_hashed > full) {
        seq->n_hashed = full;
        /* full >= n_holes; block full - 1 is the last hole when equal. */
        seq->last_hash = full == 0              ? seq->chain_seed
                         : full == seq->n_holes ? seq->hole_hash
                                                : kv->index->hash[seq->blocks[full - 1]];
    }
}

uint32_t llmi_kv_seq_release_before(llmi_kv *kv, llmi_kv_seq *seq, uint32_t pos) {
    if (pos > seq->n_tokens)
        pos = seq->n_tokens;
    /* Never the block a write continues (the one holding n_tokens). */
    uint32_t upto = pos / kv->block_size;
    uint32_t n = 0;
    while (seq->n_holes < upto) {
        uint32_t i = seq->n_holes, b = seq->blocks[i];
        /* The chain hash outlives the block; an unhashed hole gets it from
         * llmi_kv_seq_commit, which hashes tokens, not block contents. */
        if (i < seq->n_hashed)
            seq->hole_hash = kv->index->hash[b];
        seq->blocks[i] = LLMI_KV_HOLE;
        seq->n_holes = i + 1;
        block_unref(kv, b);
        n++;
    }
    return n;
}

void llmi_kv_seq_release(llmi_kv *kv, llmi_kv_seq *seq) {
    unref_tail(kv, seq, 0);
    seq->n_tokens = 0;
    seq->n_hashed = 0;
    seq->last_hash = seq->chain_seed;
    seq->n_holes = 0;
    seq->hole_hash = 0;
}

void llmi_kv_seq_destroy(llmi_kv *kv, llmi_kv_seq *seq) {
    llmi_kv_seq_release(kv, seq);
    llmi_free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}

llm_status llmi_kv_seq_fork(llmi_kv *kv, const llmi_kv_seq *src, llmi_kv_seq *dst) {
    if (src == dst || dst->n_blocks != 0 || dst->n_tokens != 0)
        return llmi_error(LLM_ERR_INVALID_ARGUMENT, "KV fork into a sequence that is not empty");
    if (!table_grow(dst, src->n_blocks))
        return llmi_oom("KV block table");
    for (uint32_t i = 0; i < src->n_blocks; i++) {
        uint32_t b = src->blocks[i];
        if (b != LLMI_KV_HOLE) {
            assert(kv->ref[b] > 0);
            kv->ref[b]++;
        }
        dst->blocks[i] = b;
    }
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_hashed = src->n_hashed;
    dst->last_hash = src->last_hash;
    dst->n_holes = src->n_holes;
    dst->hole_hash = src->hole_hash;
    dst->chain_seed = src->chain_seed;
    return LLM_OK;
}

/* ---- prefix cache ---- */

uint32_t llmi_kv_prefix_match(llmi_kv *kv, llmi_kv_seq *seq, const llm_token *tokens,
                              uint32_t max_tokens) {
    if (seq->n_blocks != 0 || seq->n_tokens != 0 || !tokens)
        return 0;
    llmi_kv_index *x = kv->index;
    uint32_t bs = kv->block_size, n_full = max_tokens / bs, i = 0;
    uint64_t h = seq->chain_seed;
    for (; i < n_full; i++) {
        const llm_token *t = tokens + (size_t)i * bs;
        uint64_t hi = block_hash(kv, h, i, t);
        uint32_t b = index_find(kv, hi);
        if (b == NONE || x->parent[b] != h || x->pos[b] != i ||
            memcmp(block_tokens(kv, b), t, (size_t)bs * sizeof *t) != 0)
            break;
        if (!table_grow(seq, i + 1))
            break; /* out of memory: a shorter match */
        if (kv->ref[b] == 0)
            lru_remove(kv, b);
        kv->ref[b]++;
        seq->blocks[i] = b;
        seq->n_blocks = i + 1;
        h = hi;
    }
    seq->n_tokens = i * bs;
    seq->n_hashed = i;
    seq->last_hash = h;
    kv->prefix_hit_tokens += (uint64_t)i * bs;
    return i * bs;
}

void llmi_kv_seq_commit(llmi_kv *kv, llmi_kv_seq *seq, const llm_token *tokens) {
    if (!tokens)
        return;
    llmi_kv_index *x = kv->index;
    uint32_t bs = kv->block_size, full = seq->n_tokens / bs;
    for (uint32_t i = seq->n_hashed; i < full; i++) {
        uint32_t b = seq->blocks[i];
        if (b == LLMI_KV_HOLE) { /* released before it was hashed */
            seq->last_hash = block_hash(kv, seq->last_hash, i, tokens + (size_t)i * bs);
            seq->hole_hash = seq->last_hash;
            seq->n_hashed = i + 1;
            continue;
        }
        if (!(x->flags[b] & F_HASHED)) {
            const llm_token *t = tokens + (size_t)i * bs;
            x->hash[b] = block_hash(kv, seq->last_hash, i, t);
            x->parent[b] = seq->last_hash;
            x->pos[b] = i;
            memcpy(block_tokens(kv, b), t, (size_t)bs * sizeof *t);
            x->flags[b] = F_HASHED;
        }
        /* A block hashed before (shared by a fork) already continues this
         * chain: a fork copies the chain with the table. */
        assert(x->parent[b] == seq->last_hash && x->pos[b] == i);
        if (!(x->flags[b] & F_REGISTERED) && index_find(kv, x->hash[b]) == NONE)
            index_insert(kv, b);
        seq->last_hash = x->hash[b];
        seq->n_hashed = i + 1;
    }
}

void llmi_kv_prefix_clear(llmi_kv *kv) {
    llmi_kv_index *x = kv->index;
    while (x->lru_head != NONE) {
        uint32_t b = x->lru_head;
        lru_remove(kv, b);
        x->flags[b] = 0;
        kv->free_stack[kv->n_free++] = b;
    }
    /* Blocks in use stay HASHED (their sequences' chains stay valid) but are
     * no longer matchable. */
    for (uint32_t b = 0; b < kv->n_blocks; b++) {
        x->flags[b] &= (uint8_t)~F_REGISTERED;
        x->chain_next[b] = NONE;
    }
    for (size_t i = 0; i <= x->bucket_mask; i++)
        x->buckets[i] = NONE;
    x->n_registered = 0;
}

/* ---- invariant check ---- */

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        st = llmi_error(LLM_ERR_INTERNAL, "KV check: " __VA_ARGS__);                               \
        goto done;                                                                                 \
    } while (0)

llm_status llmi_kv_check(const llmi_kv *kv, const llmi_kv_seq *const *seqs, size_t n_seqs) {
    const llmi_kv_index *x = kv->index;
    uint32_t n = kv->n_blocks, bs = kv->block_size;
    llm_status st = LLM_OK;
    uint32_t *count = llmi_calloc(n, sizeof *count);
    uint8_t *state = llmi_calloc(n, 1); /* 1 free stack, 2 LRU, 4 hash index */
    if (!count || !state) {
        st = llmi_oom("KV check");
        goto done;
    }
    /* Tables. */
    for (size_t s = 0; s < n_seqs; s++) {
        const llmi_kv_seq *q = seqs[s];
        if (q->n_blocks > q->cap)
            FAIL("seq %zu holds %u blocks, capacity %u", s, q->n_blocks, q->cap);
        if ((uint64_t)q->n_tokens > (uint64_t)q->n_blocks * bs)
            FAIL("seq %zu has %u tokens in %u blocks", s, q->n_tokens, q->n_blocks);
        if (q->n_hashed > q->n_tokens / bs)
            FAIL("seq %zu has %u hashed blocks but %u tokens", s, q->n_hashed, q->n_tokens);
        for (uint32_t i = 0; i < q->n_blocks; i++) {
            uint32_t b = q->blocks[i];
            if ((b == LLMI_KV_HOLE) != (i < q->n_holes))
                FAIL("seq %zu entry %u is %sa hole, %u leading holes", s, i,
                     b == LLMI_KV_HOLE ? "" : "not ", q->n_holes);
            if (b == LLMI_KV_HOLE)
                continue;
            if (b >= n)
                FAIL("seq %zu entry %u names block %u of %u", s, i, b, n);
            if (count[b] == UINT32_MAX)
                FAIL("block %u referenced too often", b);
            count[b]++;
        }
        /* The chain is checked from the last hole on (its hash is kept);
         * holes not yet hashed leave nothing to check. */
        if (q->n_hashed < q->n_holes)
            continue;
        uint64_t h = q->n_holes ? q->hole_hash : q->chain_seed;
        for (uint32_t i = q->n_holes; i < q->n_hashed; i++) {
            uint32_t b = q->blocks[i];
            if (!(x->flags[b] & F_HASHED))
                FAIL("seq %zu block %u (id %u) is not hashed", s, i, b);
            if (x->parent[b] != h || x->pos[b] != i)
                FAIL("seq %zu block %u (id %u) does not continue the hash chain", s, i, b);
            h = x->hash[b];
        }
        if (q->last_hash != h)
            FAIL("seq %zu last_hash is not the hash of its block %u", s, q->n_hashed);
    }
    /* Free stack. */
    if (kv->n_free > n)
        FAIL("n_free %u exceeds %u blocks", kv->n_free, n);
    for (uint32_t i = 0; i < kv->n_free; i++) {
        uint32_t b = kv->free_stack[i];
        if (b >= n)
            FAIL("free stack entry %u is block %u of %u", i, b, n);
        if (state[b] & 1)
            FAIL("block %u is twice on the free stack", b);
        state[b] |= 1;
        if (x->flags[b])
            FAIL("free block %u has flags %u", b, x->flags[b]);
    }
    /* LRU list. */
    uint32_t len = 0, prev = NONE;
    for (uint32_t b = x->lru_head; b != NONE; b = x->lru_next[b]) {
        if (b >= n)
            FAIL("LRU entry %u is block %u of %u", len, b, n);
        if (state[b] & 2)
            FAIL("block %u is twice on the LRU list", b);
        state[b] |= 2;
        if (x->lru_prev[b] != prev)
            FAIL("LRU block %u has a wrong back link", b);
        if (!(x->flags[b] & F_REGISTERED))
            FAIL("cached block %u is not registered", b);
        prev = b;
        len++;
    }
    if (x->lru_tail != prev)
        FAIL("LRU tail is %u, last block %u", x->lru_tail, prev);
    if (len != kv->n_cached)
        FAIL("LRU list has %u blocks, n_cached %u", len, kv->n_cached);
    /* Hash index. */
    uint32_t n_reg = 0;
    for (size_t k = 0; k <= x->bucket_mask; k++) {
        for (uint32_t b = x->buckets[k]; b != NONE; b = x->chain_next[b]) {
            if (b >= n)
                FAIL("hash bucket %zu names block %u of %u", k, b, n);
            if (state[b] & 4)
                FAIL("block %u is twice in the hash index", b);
            state[b] |= 4;
            if (!(x->flags[b] & F_REGISTERED) || !(x->flags[b] & F_HASHED))
                FAIL("indexed block %u is not registered", b);
            if (bucket_of(x, x->hash[b]) != k)
                FAIL("block %u is in the wrong bucket", b);
            if (index_find(kv, x->hash[b]) != b)
                FAIL("block %u shares its hash with another registered block", b);
            n_reg++;
        }
    }
    if (n_reg != x->n_registered)
        FAIL("hash index holds %u blocks, %u registered", n_reg, x->n_registered);
    /* Per block. */
    uint32_t used = 0;
    for (uint32_t b = 0; b < n; b++) {
        if (kv->ref[b] != count[b])
            FAIL("block %u has ref %u but %u table entries", b, kv->ref[b], count[b]);
        bool reg = x->flags[b] & F_REGISTERED;
        if (reg != ((state[b] & 4) != 0))
            FAIL("block %u registered flag disagrees with index", b);
        if ((x->flags[b] & F_HASHED) &&
            block_hash(kv, x->parent[b], x->pos[b], block_tokens(kv, b)) != x->hash[b])
            FAIL("block %u stored hash does not match its tokens", b);
        int states = (kv->ref[b] > 0) + ((state[b] & 1) != 0) + ((state[b] & 2) != 0);
        if (states != 1)
            FAIL("block %u is in %d states (ref %u, free %d, cached %d)", b, states, kv->ref[b],
                 state[b] & 1, (state[b] & 2) != 0);
        if (kv->ref[b] > 0)
            used++;
    }
    if (used + kv->n_free + kv->n_cached != n)
        FAIL("%u used + %u free + %u cached != %u blocks", used, kv->n_free, kv->n_cached, n);
done:
    llmi_free(count);
    llmi_free(state);
    return st;
}
