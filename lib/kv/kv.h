/* Block-paged KV cache with reference counts, copy-on-write, and a prefix
 * cache.
 *
 * Memory is a pool of fixed-size blocks (block_size token slots, all layers).
 * A sequence owns a block table mapping position p to
 * (table[p / block_size], p % block_size); attention reads through the table,
 * so sequences never need contiguous memory and never move.
 *
 * Every block is in exactly one state:
 *   free    ref == 0, not cached: on the free stack;
 *   used    ref >= 1: in that many block tables;
 *   cached  ref == 0, registered in the prefix cache: on the LRU list,
 *           reusable by a later prefix match, evicted (oldest first) only when
 *           an allocation finds the free stack empty.
 * A full block whose tokens are known is registered under a hash chained from
 * its parent block's hash and its tokens, so equal hashes mean equal prefixes.
 * Registered blocks are immutable: a write into a block that is shared
 * (ref > 1) first copies it (copy-on-write); a write into a registered block
 * held once unregisters it.
 *
 * This is bookkeeping only: the K/V bytes live in the backend's KV store
 * (backend/backend.h), addressed by slot = block * block_size + offset.
 * The one time the pool needs bytes moved, a copy-on-write, it calls the
 * copy function its owner installed (llmi_kv_set_copier).
 *
 * Not thread-safe: the session serialises all calls. */
#ifndef LLMI_KV_H
#define LLMI_KV_H

#include "core/core.h"
#include "core/ttype.h"

#include <stdbool.h>

typedef struct llmi_kv_index llmi_kv_index; /* private: hash table + LRU */

/* Copies the first n_slots slots of block src to block dst (all layers, K
 * and V); the status of a failed device copy. */
typedef llm_status (*llmi_kv_copy_fn)(void *ctx, uint32_t dst, uint32_t src, uint32_t n_slots);

typedef struct llmi_kv {
    uint32_t block_size, n_blocks;
    llmi_kv_copy_fn copy; /* NULL: blocks hold no bytes (tests of the bookkeeping) */
    void *copy_ctx;
    uint32_t *ref;        /* per block */
    uint32_t *free_stack; /* ids of free blocks */
    uint32_t n_free;      /* on the free stack (cached blocks not counted) */
    uint32_t n_cached;    /* ref == 0 and registered (evictable) */
    llmi_kv_index *index;
    /* counters: tokens attached by llmi_kv_prefix_match, cached blocks
     * evicted, shared blocks replaced by a private copy before a write */
    uint64_t prefix_hit_tokens, evictions, cow_copies;
} llmi_kv;

typedef struct llmi_kv_seq {
    uint32_t *blocks;   /* block table */
    uint32_t n_blocks;  /* blocks held */
    uint32_t cap;       /* table capacity */
    uint32_t n_tokens;  /* positions [0, n_tokens) hold valid K/V */
    uint32_t n_hashed;  /* leading blocks whose hashes are known (registered or matched) */
    uint64_t last_hash; /* hash of block n_hashed - 1 (chain seed when 0 blocks) */
    /* Leading table entries [0, n_holes) are LLMI_KV_HOLE: their blocks were
     * given back by llmi_kv_seq_release_before (a sliding window never reads
     * them again). Once n_hashed >= n_holes, hole_hash is the chain hash of
     * block n_holes - 1, so the chain goes on after them.
     * n_tokens >= n_holes * block_size. */
    uint32_t n_holes;
    uint64_t hole_hash;
    /* Where the hash chain starts (the parent of block 0), kept by release
     * and truncate and copied by fork: 0 for K/V of the plain model, else
     * what the K/V were computed under (a LoRA adapter and its scale), so
     * that a prefix never matches blocks computed another way. Set while
     * the sequence holds no blocks. */
    uint64_t chain_seed;
} llmi_kv_seq;

/* Block-table entry of a released block (no block, no reference). */
#define LLMI_KV_HOLE UINT32_MAX

/* Bytes per element of the float `type`: 4 for LLM_KV_F32, 2 for LLM_KV_F16
 * and LLM_KV_BF16, 0 for anything else, the block types included (their
 * sizes are per block: llmi_kv_row_bytes). */
static inline uint32_t llmi_kv_type_size(llm_kv_type type) {
    switch (type) {
    case LLM_KV_F32:
        return 4;
    case LLM_KV_F16:
    case LLM_KV_BF16:
        return 2;
    default:
        return 0;
    }
}

/* The tensor type (core/ttype.h) of a KV element type; false for a value
 * outside llm_kv_type. Q8_0 and Q4_0 rows are GGUF's blocks of LLMI_QK,
 * FP8_E4M3 rows our own (core/ttype.h). */
static inline bool llmi_kv_ttype(llm_kv_type type, llmi_ttype *out) {
    switch (type) {
    case LLM_KV_F32:
        *out = LLMI_T_F32;
        return true;
    case LLM_KV_F16:
        *out = LLMI_T_F16;
        return true;
    case LLM_KV_BF16:
        *out = LLMI_T_BF16;
        return true;
    case LLM_KV_Q8_0:
        *out = LLMI_T_Q8_0;
        return true;
    case LLM_KV_Q4_0:
        *out = LLMI_T_Q4_0;
        return true;
    case LLM_KV_FP8_E4M3:
        *out = LLMI_T_FP8_E4M3;
        return true;
    default:
        return false;
    }
}

/* Whether `type` stores blocks (Q8_0, Q4_0, FP8_E4M3): its rows are whole
 * blocks of LLMI_QK values, so a head_dim must be a multiple of LLMI_QK. */
static inline bool llmi_kv_type_blocked(llm_kv_type type) {
    return type == LLM_KV_Q8_0 || type == LLM_KV_Q4_0 || type == LLM_KV_FP8_E4M3;
}

/* Bytes of n consecutive elements of `type` (a slot's K or V row is
 * n = kv_dim; one head's part of it n = head_dim). 0 for an unknown type,
 * for an n that is not a multiple of the type's block, or on overflow. */
static inline size_t llmi_kv_row_bytes(llm_kv_type type, uint64_t n) {
    llmi_ttype t;
    return llmi_kv_ttype(type, &t) ? llmi_ttype_row_bytes(t, n) : 0;
}

/* A pool of n_blocks blocks of block_size slots. */
llm_status llmi_kv_create(uint32_t block_size, uint32_t n_blocks, llmi_kv **out);
void llmi_kv_free(llmi_kv *kv);
/* Installs the function that copies block bytes for copy-on-write. */
void llmi_kv_set_copier(llmi_kv *kv, llmi_kv_copy_fn copy, void *ctx);
/* Bytes one block takes: K and V, all layers, elements of elem_size bytes
 * (llmi_kv_type_size). llmi_kv_block_bytes is the f32 size (elem_size 4). */
size_t llmi_kv_block_bytes_ex(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size,
                              size_t elem_size);
size_t llmi_kv_block_bytes(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size);
/* Bytes one block takes in `type` (rows of llmi_kv_row_bytes); 0 for a
 * type or kv_dim llmi_kv_row_bytes refuses. */
size_t llmi_kv_block_bytes_type(uint32_t n_layer, uint32_t kv_dim, uint32_t block_size,
                                llm_kv_type type);
/* Blocks an allocation can get now: free plus evictable cached. */
static inline uint32_t llmi_kv_available(const llmi_kv *kv) { return kv->n_free + kv->n_cached; }

/* Makes `seq` writable for positions [seq->n_tokens, n_tokens): allocates the
 * missing blocks (evicting cached ones if needed) and copies or unregisters
 * the block holding position seq->n_tokens if it is shared or registered.
 * Does not change seq->n_tokens. LLM_ERR_LIMIT (pool exhausted) or
 * LLM_ERR_OUT_OF_MEMORY leave the sequence and the pool unchanged; a failed
 * block copy (the copier's status) may leave blocks before the failing one
 * replaced by equal private copies. */
llm_status llmi_kv_seq_reserve(llmi_kv *kv, llmi_kv_seq *seq, uint32_t n_tokens);
/* Blocks llmi_kv_seq_reserve(kv, seq, n_tokens) would take from the pool. */
uint32_t llmi_kv_seq_blocks_needed(const llmi_kv *kv, const llmi_kv_seq *seq, uint32_t n_tokens);

/* Drops positions >= n_tokens (blocks past the end are released). A
 * sequence cannot be cut below its first live position
 * (llmi_kv_seq_first_pos): n_tokens is raised to it; callers refuse such a
 * truncation first. */
void llmi_kv_seq_truncate(llmi_kv *kv, llmi_kv_seq *seq, uint32_t n_tokens);
/* Gives back the leading blocks that lie wholly before position `pos`
 * (call llmi_kv_seq_commit first to keep them in the prefix cache): their
 * table entries become holes, their references are dropped (a registered block
 * goes to the prefix cache when no table holds it any more). Blocks at or
 * after the block of seq->n_tokens are never released. Returns the number
 * of blocks released. For sliding-window models, whose K/V before the
 * window is never read again. */
uint32_t llmi_kv_seq_release_before(llmi_kv *kv, llmi_kv_seq *seq, uint32_t pos);
/* The first position whose K/V the sequence still holds. */
static inline uint32_t llmi_kv_seq_first_pos(const llmi_kv *kv, const llmi_kv_seq *seq) {
    return seq->n_holes * kv->block_size;
}
/* Releases every block and empties the sequence (keeps the table memory). */
void llmi_kv_seq_release(llmi_kv *kv, llmi_kv_seq *seq);
/* Release plus freeing the table memory; leaves *seq zeroed. */
void llmi_kv_seq_destroy(llmi_kv *kv, llmi_kv_seq *seq);

/* dst (empty) shares every block of src: references are added, nothing is
 * copied; the first write to a shared partial block copies it. Holes stay
 * holes. */
llm_status llmi_kv_seq_fork(llmi_kv *kv, const llmi_kv_seq *src, llmi_kv_seq *dst);

/* Prefix cache. `tokens` is the sequence's full token history. */
/* Attaches to the empty `seq` the cached blocks that hold the longest prefix
 * of tokens[0, max_tokens) in whole blocks; returns the tokens covered (a
 * multiple of block_size), sets seq->n_tokens to it, counts prefix hits. */
uint32_t llmi_kv_prefix_match(llmi_kv *kv, llmi_kv_seq *seq, const llm_token *tokens,
                              uint32_t max_tokens);
/* Registers the full blocks of seq not yet registered (positions below
 * seq->n_tokens). A block whose hash is already registered by another block
 * stays unregistered (the duplicate is simply freed later). */
void llmi_kv_seq_commit(llmi_kv *kv, llmi_kv_seq *seq, const llm_token *tokens);
/* Forgets every cached block (they become free). Blocks in use are
 * unregistered too, so nothing registered before the call matches after it. */
void llmi_kv_prefix_clear(llmi_kv *kv);
#ifdef LLMI_TEST_HOOKS
/* Test hook (core.h, "Test hooks"): keeps only the low `bits` bits of every
 * block hash (64 = all), to force hash collisions. Call right after
 * llmi_kv_create. */
void llmi_kv_test_hash_bits(llmi_kv *kv, unsigned bits);
#endif

/* Checks the invariants against the complete list of live sequences:
 * ref[b] equals the number of table entries naming b; every block is exactly
 * one of free / used / cached; counts match; holes only lead a table and
 * the hash chain goes on from hole_hash. LLM_ERR_INTERNAL with a message
 * naming the first violation. For tests and debug builds. */
llm_status llmi_kv_check(const llmi_kv *kv, const llmi_kv_seq *const *seqs, size_t n_seqs);

/* The slot of position `pos` of `seq`: where its K/V lie in a KV store.
 * pos must be at or after llmi_kv_seq_first_pos (a hole has no slot). */
static inline uint32_t llmi_kv_slot(const llmi_kv *kv, const llmi_kv_seq *seq, uint32_t pos) {
    return seq->blocks[pos / kv->block_size] * kv->block_size + pos % kv->block_size;
}

#endif
