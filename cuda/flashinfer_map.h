/* How a step's attention rows map onto FlashInfer's paged KV cache
 * (cuda/attention_flashinfer.cu; docs/cuda.md, "FlashInfer attention"),
 * as plain C that the host tests compile too (tests/cuda/test_flashinfer_map).
 *
 * FlashInfer's batch prefill takes "requests": request b has the queries
 * q_indptr[b] .. q_indptr[b + 1] (packed, in order) at the last positions
 * of its kv_len keys, and its keys in the pages indices[kv_indptr[b]] ..
 * indices[kv_indptr[b + 1] - 1], all full but the last, which holds
 * last_page_len[b] keys: kv_len = (pages - 1) * page_size + last_page_len.
 * Our KV cache is that layout (NHD) already: a page is one of our blocks
 * (block_size slots of kv_dim elements, a head's head_dim of them at
 * kv_head * head_dim), and a sequence's pages are its block table,
 * blocks[block_start[seq] ..]. A request is one run of rows of one
 * sequence at consecutive positions (a tile of llmi_cuda_prefill_plan, or
 * a single row), so its keys are positions 0 .. pos(last row) and its
 * first query sits at kv_len - rows, as FlashInfer's causal mask assumes. */
#ifndef LLMI_CUDA_FLASHINFER_MAP_H
#define LLMI_CUDA_FLASHINFER_MAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LLMI_FI_HD __host__ __device__ __forceinline__
#else
#define LLMI_FI_HD static inline
#endif

/* Where the requests' rows are: pairs {first row, rows} at `tiles`; else
 * one row a request, rows[b] (or row b when rows is NULL too). */
typedef struct llmi_fi_requests {
    const uint32_t *tiles;
    const uint32_t *rows;
    uint32_t n;
} llmi_fi_requests;

typedef struct llmi_fi_run {
    uint32_t first_row, n_rows;
} llmi_fi_run;

LLMI_FI_HD llmi_fi_run llmi_fi_request(const llmi_fi_requests *reqs, uint32_t b) {
    llmi_fi_run run;
    if (reqs->tiles) {
        run.first_row = reqs->tiles[2 * b];
        run.n_rows = reqs->tiles[2 * b + 1];
    } else {
        run.first_row = reqs->rows ? reqs->rows[b] : b;
        run.n_rows = 1;
    }
    return run;
}

/* Keys request `run` sees: every position up to its last row's. */
LLMI_FI_HD uint32_t llmi_fi_kv_len(const uint32_t *pos, llmi_fi_run run) {
    return pos[run.first_row + run.n_rows - 1] + 1;
}

LLMI_FI_HD uint32_t llmi_fi_pages(uint32_t kv_len, uint32_t block_size) {
    return (kv_len + block_size - 1) / block_size;
}

/* Keys in the last page (1 .. block_size for kv_len > 0). */
LLMI_FI_HD uint32_t llmi_fi_last_page_len(uint32_t kv_len, uint32_t block_size) {
    return kv_len - (llmi_fi_pages(kv_len, block_size) - 1) * block_size;
}

/* FlashInfer's window_left: a query at p sees keys at k with p - k <=
 * window_left (-1: no window); ours, p - k < window (0: no window). */
LLMI_FI_HD int32_t llmi_fi_window_left(uint32_t window) {
    return window ? (int32_t)(window - 1) : -1;
}

/* CTAs a request of n_rows rows takes along FlashInfer's query axis: the
 * rows of a GQA group's heads are packed (rows x group) into tiles of
 * cta_tile_q. */
LLMI_FI_HD uint32_t llmi_fi_qo_tiles(uint32_t n_rows, uint32_t group, uint32_t cta_tile_q) {
    return (n_rows * group + cta_tile_q - 1) / cta_tile_q;
}

/* With KV splits (single rows: a request of one query), FlashInfer's
 * kernel cuts a request's keys into chunks of `chunk` keys from its first
 * visible one, and its output rows into ceil(min(kv_len, window_left' +
 * cta_tile_q) / chunk) partial rows (window_left' = kv_len without a
 * window), merged afterwards; its own planner launches that many CTAs along
 * the KV axis, and so do we. */
LLMI_FI_HD uint32_t llmi_fi_kv_chunks(uint32_t kv_len, int32_t window_left, uint32_t cta_tile_q,
                                      uint32_t chunk) {
    const uint32_t wl = window_left >= 0 ? (uint32_t)window_left : kv_len;
    const uint32_t span = kv_len < wl + cta_tile_q ? kv_len : wl + cta_tile_q;
    const uint32_t n = (span + chunk - 1) / chunk;
    return n ? n : 1;
}

/* What request b adds to FlashInfer's index arrays: its query rows, its
 * pages and last page's length, and (chunk > 0: KV splits) its partial
 * rows, rows x chunks. The arrays are the prefix sums of these
 * (llmi_fi_plan below; a block-wide scan on the device). */
typedef struct llmi_fi_counts {
    uint32_t rows, pages, last_page_len, partials;
} llmi_fi_counts;

LLMI_FI_HD llmi_fi_counts llmi_fi_request_counts(const llmi_fi_requests *reqs, uint32_t b,
                                                 const uint32_t *pos, uint32_t block_size,
                                                 int32_t window_left, uint32_t cta_tile_q,
                                                 uint32_t chunk) {
    const llmi_fi_run run = llmi_fi_request(reqs, b);
    const uint32_t kv_len = llmi_fi_kv_len(pos, run);
    llmi_fi_counts c;
    c.rows = run.n_rows;
    c.pages = llmi_fi_pages(kv_len, block_size);
    c.last_page_len = llmi_fi_last_page_len(kv_len, block_size);
    c.partials = chunk ? run.n_rows * llmi_fi_kv_chunks(kv_len, window_left, cta_tile_q, chunk) : 0;
    return c;
}

/* q_indptr, kv_indptr ([n + 1] each, from 0), last_page_len ([n]) and,
 * with chunk > 0, o_indptr ([n + 1], from 0: the partial rows of KV
 * splits) of the requests, serially. Returns the number of pages (the
 * length indices needs). */
LLMI_FI_HD uint32_t llmi_fi_plan(const llmi_fi_requests *reqs, const uint32_t *pos,
                                 uint32_t block_size, int32_t window_left, uint32_t cta_tile_q,
                                 uint32_t chunk, int32_t *q_indptr, int32_t *kv_indptr,
                                 int32_t *last_page_len, int32_t *o_indptr) {
    uint32_t rows = 0, pages = 0, partials = 0;
    q_indptr[0] = 0;
    kv_indptr[0] = 0;
    if (chunk)
        o_indptr[0] = 0;
    for (uint32_t b = 0; b < reqs->n; b++) {
        const llmi_fi_counts c =
            llmi_fi_request_counts(reqs, b, pos, block_size, window_left, cta_tile_q, chunk);
        rows += c.rows;
        pages += c.pages;
        partials += c.partials;
        q_indptr[b + 1] = (int32_t)rows;
        kv_indptr[b + 1] = (int32_t)pages;
        last_page_len[b] = (int32_t)c.last_page_len;
        if (chunk)
            o_indptr[b + 1] = (int32_t)partials;
    }
    return pages;
}

/* Page i of request b: block i of its sequence's table. */
LLMI_FI_HD int32_t llmi_fi_page(const uint32_t *seq, const uint32_t *block_start,
                                const uint32_t *blocks, llmi_fi_run run, uint32_t i) {
    return (int32_t)blocks[block_start[seq[run.first_row]] + i];
}

#endif
