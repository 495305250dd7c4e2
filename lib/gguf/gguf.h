/* GGUF v2/v3 reader (mmap or read, every field bounds-checked) and an
 * in-memory GGUF writer used by tests and benchmarks to make models.
 *
 * Its own module, just above core: it knows the file format and nothing of
 * architectures or tokenizers, which read their keys from it (model/,
 * tokenizer/). Includes core only. */
#ifndef LLMI_GGUF_H
#define LLMI_GGUF_H

#include "core/core.h"
#include "core/ttype.h"

#include <stdbool.h>

/* GGUF metadata value types (pinned by the file format). */
typedef enum llmi_gguf_vtype {
    LLMI_GGUF_U8 = 0, LLMI_GGUF_I8 = 1, LLMI_GGUF_U16 = 2, LLMI_GGUF_I16 = 3,
    LLMI_GGUF_U32 = 4, LLMI_GGUF_I32 = 5, LLMI_GGUF_F32 = 6, LLMI_GGUF_BOOL = 7,
    LLMI_GGUF_STRING = 8, LLMI_GGUF_ARRAY = 9, LLMI_GGUF_U64 = 10,
    LLMI_GGUF_I64 = 11, LLMI_GGUF_F64 = 12,
} llmi_gguf_vtype;

/* A string inside the file: not NUL-terminated. */
typedef struct llmi_str { const char *ptr; uint64_t len; } llmi_str;

typedef struct llmi_gguf_kv {
    llmi_str key;
    llmi_gguf_vtype type;
    /* Scalars (type != STRING/ARRAY): the value widened. */
    union { uint64_t u; int64_t i; double f; bool b; } scalar;
    llmi_str str;              /* type == STRING */
    llmi_gguf_vtype arr_type;  /* type == ARRAY: element type (no nested arrays) */
    uint64_t arr_len;
    const uint8_t *arr_data;   /* raw little-endian elements (fixed-size types) */
    llmi_str *arr_strs;        /* arr_type == STRING: arr_len strings */
} llmi_gguf_kv;

typedef struct llmi_gguf_tensor {
    llmi_str name;
    uint32_t n_dims;           /* 1..4 */
    uint64_t ne[4];            /* ne[0] is the contiguous (row) dimension; unused = 1 */
    llmi_ttype type;
    uint64_t offset;           /* from the start of the data section */
    size_t nbytes;
    const void *data;          /* valid while the file is open */
} llmi_gguf_tensor;

typedef struct llmi_gguf {
    uint32_t version;
    uint64_t n_kv, n_tensors;
    llmi_gguf_kv *kv;
    llmi_gguf_tensor *tensors;
    uint32_t alignment;
    /* private */
    const uint8_t *base; size_t size; bool mapped; void *owned;
} llmi_gguf;

/* Drops this process's pages of [data, data + bytes) when that range lies
 * in g's mapping (whole pages inside it only): the page cache keeps them
 * and the next read faults them back, so the data stays valid. A no-op for
 * a file read into memory (dropping those pages would lose them) and for a
 * range outside the file. For a reader that keeps its own copy of a tensor
 * and will not read the file's for a while. */
void llmi_gguf_release_pages(const llmi_gguf *g, const void *data, size_t bytes);

/* Opens and validates a file. use_mmap=false reads it into anonymous memory. */
llm_status llmi_gguf_open(const char *path, bool use_mmap, llmi_gguf **out);
/* As llmi_gguf_open, reporting LLM_PROGRESS_READ to `progress` (may be
 * NULL): bytes read in chunks, or a mapping at once. */
llm_status llmi_gguf_open_progress(const char *path, bool use_mmap, const llmi_progress *progress,
                                   llmi_gguf **out);
/* Parses a buffer the caller keeps alive (fuzzing, tests). */
llm_status llmi_gguf_open_memory(const void *data, size_t size, llmi_gguf **out);
void llmi_gguf_close(llmi_gguf *g);

/* Lookups; NULL when absent. */
const llmi_gguf_kv *llmi_gguf_find(const llmi_gguf *g, const char *key);
const llmi_gguf_tensor *llmi_gguf_find_tensor(const llmi_gguf *g, const char *name);
bool llmi_str_eq(llmi_str s, const char *c);
/* "u32", "string", ...; "unknown" for values outside the enum. */
const char *llmi_gguf_vtype_name(uint32_t type);
/* Bytes of one value of a fixed-size type in a file; 0 for string, array
 * and unknown types. */
size_t llmi_gguf_vtype_size(uint32_t type);

/* Typed getters: LLM_ERR_NOT_FOUND if absent (when required) or
 * LLM_ERR_BAD_FORMAT if present with an incompatible type; each message names
 * the key. Integer getters accept any integer type whose value fits; the f32
 * getter accepts f32 and f64. An absent optional key gives LLM_OK and leaves
 * *out unchanged, so callers preset defaults. NULL g, key or out:
 * LLM_ERR_INVALID_ARGUMENT. */
llm_status llmi_gguf_get_u32(const llmi_gguf *g, const char *key, bool required, uint32_t *out);
llm_status llmi_gguf_get_f32(const llmi_gguf *g, const char *key, bool required, float *out);
llm_status llmi_gguf_get_bool(const llmi_gguf *g, const char *key, bool required, bool *out);
llm_status llmi_gguf_get_str(const llmi_gguf *g, const char *key, bool required, llmi_str *out);
/* Array getter: checks element type; out points into the file. */
llm_status llmi_gguf_get_arr(const llmi_gguf *g, const char *key, bool required,
                             llmi_gguf_vtype elem_type, const llmi_gguf_kv **out);

/* ---- writer ---- */
typedef struct llmi_gguf_writer llmi_gguf_writer;
llm_status llmi_gguf_writer_create(llmi_gguf_writer **out);
void llmi_gguf_writer_free(llmi_gguf_writer *w);
llm_status llmi_gguf_w_u32(llmi_gguf_writer *w, const char *key, uint32_t v);
llm_status llmi_gguf_w_i32(llmi_gguf_writer *w, const char *key, int32_t v);
llm_status llmi_gguf_w_f32(llmi_gguf_writer *w, const char *key, float v);
llm_status llmi_gguf_w_bool(llmi_gguf_writer *w, const char *key, bool v);
llm_status llmi_gguf_w_str(llmi_gguf_writer *w, const char *key, const char *v);
llm_status llmi_gguf_w_arr_str(llmi_gguf_writer *w, const char *key, const char *const *v, size_t n);
llm_status llmi_gguf_w_arr_f32(llmi_gguf_writer *w, const char *key, const float *v, size_t n);
llm_status llmi_gguf_w_arr_i32(llmi_gguf_writer *w, const char *key, const int32_t *v, size_t n);
/* Any fixed-size scalar type: `value` points to the matching C type (uint8_t,
 * int16_t, ..., bool, float, double). Setting general.alignment (u32, a power
 * of two) changes the alignment the writer lays tensors out with. */
llm_status llmi_gguf_w_scalar(llmi_gguf_writer *w, const char *key, llmi_gguf_vtype type,
                              const void *value);
/* Array of any fixed-size element type; `v` is a C array of the matching type. */
llm_status llmi_gguf_w_arr(llmi_gguf_writer *w, const char *key, llmi_gguf_vtype elem_type,
                           const void *v, size_t n);
/* Re-adds a metadata entry read from a GGUF file (any type) under its own key. */
llm_status llmi_gguf_w_copy_kv(llmi_gguf_writer *w, const llmi_gguf_kv *kv);
/* Adds a tensor from f32 data, converted/quantized to `type` (ne[0] must be a
 * multiple of the type's block). Data is copied. */
llm_status llmi_gguf_w_tensor(llmi_gguf_writer *w, const char *name, llmi_ttype type,
                              uint32_t n_dims, const uint64_t *ne, const float *data);
/* Adds a tensor whose bytes are already in `type`'s layout. */
llm_status llmi_gguf_w_tensor_raw(llmi_gguf_writer *w, const char *name, llmi_ttype type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data,
                                  size_t nbytes);
/* Serialises as GGUF v3 (alignment 32). */
llm_status llmi_gguf_writer_save(llmi_gguf_writer *w, const char *path);
llm_status llmi_gguf_writer_to_memory(llmi_gguf_writer *w, void **data, size_t *size); /* llmi_free */

/* ---- assembled from parts ----
 * A gguf whose metadata comes from a writer and whose tensors point into
 * memory handed over to it (file mappings, buffers): how other checkpoint
 * formats (lib/hf) are read as GGUF without copying their weights. The parts
 * collect that memory and the tensor table; llmi_gguf_parts_finish turns
 * them into an llmi_gguf that owns everything until llmi_gguf_close. */
typedef struct llmi_gguf_parts llmi_gguf_parts;
llm_status llmi_gguf_parts_create(llmi_gguf_parts **out);
/* Unmaps and frees everything handed over; NULL is a no-op. */
void llmi_gguf_parts_release(llmi_gguf_parts *p);
/* Hands over a mapping from mmap (munmap'd on release); on failure it is
 * unmapped at once, so the caller never keeps it. */
llm_status llmi_gguf_parts_keep_mapping(llmi_gguf_parts *p, void *addr, size_t len);
/* Hands over a buffer from llmi_malloc_aligned (llmi_free_aligned on
 * release); on failure it is freed at once. */
llm_status llmi_gguf_parts_keep_buffer(llmi_gguf_parts *p, void *buf);
/* Adds a tensor (name copied; ne[0] is the contiguous dimension, as in
 * GGUF) whose `nbytes` bytes at `data` live in memory handed over, or
 * static. nbytes must equal the size the type and shape give. */
llm_status llmi_gguf_parts_tensor(llmi_gguf_parts *p, const char *name, llmi_ttype type,
                                  uint32_t n_dims, const uint64_t *ne, const void *data,
                                  size_t nbytes);
/* Builds the gguf from the writer's metadata (a writer holding tensors is
 * refused) and the parts' tensors, which must have distinct names. Consumes
 * `p` whatever the outcome; the writer stays the caller's. */
llm_status llmi_gguf_parts_finish(llmi_gguf_parts *p, llmi_gguf_writer *meta, llmi_gguf **out);

#endif
