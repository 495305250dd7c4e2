/* The backend interface: a versioned table of operations, registered by
 * name, through which the core reaches the hardware. It is also the ABI
 * between the core and a backend built as a plug-in (the CUDA backend in
 * cuda/, loaded with dlopen): docs/design.md describes it for plug-in
 * authors.
 *
 * A backend owns device memory. Four kinds of object, each created and freed
 * by the backend:
 *   instance  one per session: the CPU's thread pool, a GPU's stream and
 *             library handles. The draft model's engine shares its
 *             session's instance.
 *   weights   one per (model, backend, device), shared by every session and
 *             draft engine that runs the model there (llmi_backend_weights
 *             keeps the count): a GPU uploads a model once.
 *   KV store  the bytes of a KV block pool: n_blocks blocks of block_size
 *             token slots, every layer, K and V, elements of one type. The
 *             bookkeeping (block ids, reference counts, prefix hashes, LRU)
 *             is the core's (kv/kv.h) and never touches these bytes; it asks
 *             the backend to copy a block for copy-on-write.
 *   step ctx  scratch for running steps of up to max_rows rows with
 *             attention over up to max_ctx positions, on given weights.
 *
 * Why the seam is a whole step, not per-op dispatch (matmul, rmsnorm, rope,
 * attention, ...): a GPU backend wants whole decode steps. It captures a
 * step as a CUDA graph, fuses kernels, keeps activations on the device from
 * the embedding to the logits and overlaps its launches with the host; a
 * per-op interface would cost a host round trip per op and pin one kernel
 * boundary and one activation layout for every backend. Everything around
 * the step (scheduling, block tables, sampling, speculative decoding) stays
 * in the core and is shared by every backend.
 *
 * Versions (as sqlite3_vfs carries iVersion): `version` says which entries
 * of the table are valid: those of every version up to it. The core refuses
 * a table older than LLMI_BACKEND_VERSION_MIN and never calls an entry newer
 * than the table's version. Entries are only appended; a new version may
 * also append fields to the structs below (never reorder them). The
 * `const llm_model *` handed to weights_load is the core's own model struct
 * (model/model.h), so a plug-in is built from the same source release as the
 * core it loads into: the version check is what catches a mismatch.
 *
 * Contract of every entry: returns a status (LLM_ERR_BACKEND for a device
 * failure, LLM_ERR_OUT_OF_MEMORY when memory runs out, never aborts);
 * constructors leave *out NULL on failure with nothing to free; free entries
 * accept NULL. Entries marked optional may be NULL. */
#ifndef LLMI_BACKEND_H
#define LLMI_BACKEND_H

#include "core/core.h"
#include "model/adapter.h"
#include "model/model.h"

#include <stdatomic.h>
#include <stdbool.h>

#define LLMI_BACKEND_VERSION 5
#define LLMI_BACKEND_VERSION_MIN 1
#define LLMI_BACKEND_MAX 8 /* registered backends at once */

/* What a session asks of its backend instance. */
typedef struct llmi_backend_config {
    uint32_t n_threads; /* CPU threads (>= 1) */
    int32_t device;     /* device id; 0 for the CPU */
} llmi_backend_config;

/* Shape of a KV store. A slot is a token position of one block:
 * slot = block * block_size + position % block_size. */
typedef struct llmi_kv_layout {
    uint32_t n_layer, kv_dim, block_size, n_blocks;
    llm_kv_type type; /* element type: LLM_KV_F32, F16, BF16, Q8_0 or Q4_0 */
    /* Appended: elements per KV head (kv_dim is a whole number of heads),
     * for a backend that splits heads (tp); 0 when the caller does not say. */
    uint32_t head_dim;
} llmi_kv_layout;

/* One step, everything a backend reads to run it, laid out so that a device
 * backend uploads it in one copy: the arrays are consecutive uint32 words
 * of one buffer (`words`, `n_words`).
 *   rows:   token[r], pos[r], seq[r] (the row's sequence slot, < n_seqs).
 *           Rows of one sequence come in increasing position order; the
 *           sequence's K/V holds every position before its first row.
 *   tables: the block table of sequence slot s is
 *           blocks[block_start[s] .. block_start[s + 1]) (CSR); it covers
 *           every position of its rows. With sliding windows on every
 *           layer, leading entries may be LLMI_KV_HOLE (kv/kv.h: released
 *           blocks); they lie wholly before every row's window, so a
 *           backend that reads only the window never meets one.
 *   logits: logit_rows[0 .. n_logits) are the rows whose logits are
 *           wanted, ascending; logits go out in that order, n_vocab floats
 *           each. */
typedef struct llmi_step {
    uint32_t n_rows, n_seqs, n_logits, block_size;
    const int32_t *token;        /* [n_rows] */
    const uint32_t *pos;         /* [n_rows] */
    const uint32_t *seq;         /* [n_rows] */
    const uint32_t *block_start; /* [n_seqs + 1] */
    const uint32_t *blocks;      /* [block_start[n_seqs]] */
    const uint32_t *logit_rows;  /* [n_logits] */
    const uint32_t *words;       /* the buffer all of the above point into */
    size_t n_words;
    /* The host's interrupt flag (llm_session_interrupt), or NULL. A backend
     * that sees it set while the step runs (the CPU: between layers) may
     * stop and fail the step with LLM_ERR_CANCELLED; like any failed step
     * it then changes nothing the engine keeps. */
    const atomic_int *interrupt;
    /* Appended in version 5. LoRA adapters (model/adapter.h): row r takes
     * adapters[row_adapter[r] - 1]'s update at adapter_scale[row_adapter[r]
     * - 1], or none when row_adapter[r] is 0; each (adapter, scale) pair is
     * listed once. n_adapters is 0 (and the arrays NULL) in a step without
     * them, which is the only kind a backend whose table has `lora` false
     * is given. row_adapter lies in `words`, after logit_rows. */
    uint32_t n_adapters;
    const uint32_t *row_adapter;        /* [n_rows] */
    const llm_adapter *const *adapters; /* [n_adapters] */
    const float *adapter_scale;         /* [n_adapters] */
} llmi_step;

/* The KV slot of position `pos` of sequence slot `s`. */
static inline uint32_t llmi_step_slot(const llmi_step *st, uint32_t s, uint32_t pos) {
    return st->blocks[st->block_start[s] + pos / st->block_size] * st->block_size +
           pos % st->block_size;
}

typedef struct llmi_backend_ops {
    uint32_t version; /* LLMI_BACKEND_VERSION the table was built for */
    const char *name; /* "cpu", "cuda", "tp", ... */

    /* ---- version 1 ---- */
    /* Whether the backend can run here: LLM_OK, or LLM_ERR_UNSUPPORTED
     * with a message saying why (no driver, no device). Optional (NULL:
     * always available). */
    llm_status (*probe)(void);
    llm_status (*open)(const llmi_backend_config *cfg, void **out);
    void (*close)(void *backend);

    /* The model's weights on `device`, in the backend's layout. */
    llm_status (*weights_load)(const llm_model *m, int32_t device, void **out);
    void (*weights_free)(void *weights);

    llm_status (*kv_create)(void *backend, const llmi_kv_layout *layout, void **out);
    void (*kv_free)(void *kv);
    /* Copies the first n_slots slots of block src to block dst, K and V of
     * every layer (copy-on-write). Operations on one KV store (copies, row
     * reads and writes, steps) take effect in the order they are issued: a
     * kv_read sees every earlier kv_copy, kv_write and step, with no sync
     * between (a device backend keeps them on one stream). */
    llm_status (*kv_copy)(void *kv, uint32_t dst, uint32_t src, uint32_t n_slots);
    /* n consecutive slots from `slot` (inside one block) of one layer's K
     * (v false) or V, as raw elements of the store's type: read into `dst`
     * or written from `src`, n rows of llmi_kv_row_bytes(type, kv_dim)
     * bytes (Q8_0 and Q4_0 rows are GGUF blocks), in issue order (above):
     * a read returns once its rows are in `dst`. */
    llm_status (*kv_read)(void *kv, uint32_t layer, bool v, uint32_t slot, uint32_t n, void *dst);
    llm_status (*kv_write)(void *kv, uint32_t layer, bool v, uint32_t slot, uint32_t n,
                           const void *src);

    llm_status (*step_create)(void *backend, const llm_model *m, void *weights, uint32_t max_rows,
                              uint32_t max_ctx, void **out);
    void (*step_free)(void *step);
    /* Runs a step (checked by the core: rows <= max_rows, tokens in the
     * vocabulary, positions < max_ctx, block tables covering them): writes
     * the K/V of every row at its slot and the wanted logits to `logits`
     * (host memory). It may return before the device finished; `sync` waits.
     * A failed step may have written K/V at its rows' slots and nothing
     * else: the core keeps sequence lengths unchanged, so those slots lie
     * past every sequence's end. */
    llm_status (*step_run)(void *step, void *kv, const llmi_step *st, float *logits);
    /* Waits until everything issued on the instance is done; reports an
     * asynchronous device failure. */
    llm_status (*sync)(void *backend);
    /* Optional: keep activations in f32 (tests against llama.cpp). */
    void (*step_set_f32_activations)(void *step, bool on);

    /* ---- version 2 ---- */
    /* Optional: the number of devices (ids 0 .. *out - 1), called only
     * after probe succeeded; 0 makes the backend unavailable. NULL: one
     * device, id 0. */
    llm_status (*device_count)(uint32_t *out);

    /* ---- version 3 ---- */
    /* Optional: tensor parallelism across n_ranks (> 1) of this backend's
     * devices, devices[r] the device of rank r (distinct, each below
     * device_count: the core checks). *out is a table whose entries run
     * the whole group, one model split across the ranks (docs/
     * tensor-parallel.md); its `device` arguments and config.device are 0.
     * The backend keeps the table for the life of the process, one per
     * distinct device list, so the shared weights (keyed by table) of a
     * group load once. A model that does not split is refused by the
     * group's weights_load. NULL: the backend offers no groups, and
     * tensor_parallel > 1 on it is refused. */
    llm_status (*group)(uint32_t n_ranks, const int32_t *devices,
                        const struct llmi_backend_ops **out);

    /* ---- version 4 ---- */
    /* Optional: step_run, except that the wanted rows (logit_rows) get
     * their final hidden state instead of logits: the residual stream
     * after the last layer, normed with the model's output norm (the
     * vector the LM head would multiply), n_embd floats each, in
     * logit_rows order, into `hidden` (host memory). K/V are written as
     * by step_run. Embeddings are built on it. NULL (or an older table):
     * the backend cannot return hidden states, and embedding on it gives
     * LLM_ERR_UNSUPPORTED. */
    llm_status (*step_run_hidden)(void *step, void *kv, const llmi_step *st, float *hidden);

    /* ---- version 5 ---- */
    /* Whether steps may carry LoRA adapters (llmi_step.n_adapters > 0):
     * the backend applies each row's low-rank update after every projection
     * its adapter targets, and leaves rows without one exactly as without
     * adapters. false (or an older table): the engine refuses such steps
     * with LLM_ERR_UNSUPPORTED before the backend sees them. */
    bool lora;
} llmi_backend_ops;

/* ---- registry ---- */

/* Adds a backend; LLM_ERR_INVALID_ARGUMENT for a table without a name or a
 * required entry, LLM_ERR_UNSUPPORTED for a version outside
 * [LLMI_BACKEND_VERSION_MIN, LLMI_BACKEND_VERSION], LLM_ERR_LIMIT when the
 * registry is full. Registering a name again replaces the table (tests).
 * Thread-safe. The CPU backend is always registered. */
llm_status llmi_backend_register(const llmi_backend_ops *ops);
/* Removes a backend registered by name (not "cpu"); no-op when absent. */
void llmi_backend_unregister(const char *name);
/* The backend registered under `name`, or NULL. A known plug-in's name
 * ("cuda") first has the plug-ins looked for (llmi_backend_plugin_autoload,
 * backend/plugin.h); other lookups, and the list below, never load one.
 * Lives in select.c, with the other lookups that may load a plug-in. */
const llmi_backend_ops *llmi_backend_find(const char *name);
/* Registered backends, in registration order ("cpu" first); returns the
 * count, writes at most `cap` tables. */
size_t llmi_backend_list(const llmi_backend_ops **out, size_t cap);

/* ---- choosing a backend by name (the public device API; select.c) ---- */

/* A backend as users see it (llm_backend_get_info). */
typedef struct llmi_backend_state {
    const char *name;            /* static storage */
    const llmi_backend_ops *ops; /* NULL: a known plug-in that is not registered */
    bool available;              /* probe succeeded and it has a device */
    uint32_t n_devices;          /* 0 when unavailable */
    char reason[256];            /* why unavailable; "" when available */
} llmi_backend_state;

/* The backends users can name: the registered ones in registration order
 * ("cpu" first), then the known plug-ins that are not registered ("cuda"),
 * which are unavailable. The count changes when a backend registers. These
 * and llmi_backend_select (for any name but "cpu") look for the plug-ins
 * first, once per process. */
size_t llmi_backend_state_count(void);
/* Describes backend `index` of that list, probing it; the thread's last
 * error message is left as it was. LLM_ERR_NOT_FOUND past the end. */
llm_status llmi_backend_state_get(size_t index, llmi_backend_state *out);
/* The backend a user's name asks for, probed, and its device count.
 * NULL or "" is "cpu". "auto" is the first available registered backend
 * other than "cpu", else "cpu"; each one skipped is logged (INFO) with the
 * reason. A name not registered, or a backend that is unavailable, gives
 * LLM_ERR_UNSUPPORTED saying why, or which backends there are. */
llm_status llmi_backend_select(const char *name, const llmi_backend_ops **out, uint32_t *n_devices);

/* The CPU backend (backend/cpu/). */
extern const llmi_backend_ops llmi_backend_cpu;

/* ---- shared weights ---- */

/* The weights of `m` on (ops, device): loaded on first use, then shared;
 * each successful call takes a reference that llmi_backend_weights_release
 * drops (the last one frees them). Thread-safe. */
llm_status llmi_backend_weights_acquire(const llmi_backend_ops *ops, const llm_model *m,
                                        int32_t device, void **out);
void llmi_backend_weights_release(const llmi_backend_ops *ops, const llm_model *m, int32_t device);

#ifdef LLMI_TEST_HOOKS
/* Test hooks, in the style of llmi_alloc_fail_after. Every step_create and
 * step_run issued through an engine (a session's target model and its
 * draft model alike) counts as one backend call.
 * llmi_backend_fault_inject(n, status) restarts the count at 0 and makes the
 * n-th call from now (n >= 1) fail with `status` (LLM_ERR_BACKEND or
 * LLM_ERR_OUT_OF_MEMORY) and the message "injected backend fault" before it
 * does anything; the calls after it succeed again. n = 0 (or status LLM_OK)
 * disables. Atomic: safe while other threads run steps. */
void llmi_backend_fault_inject(uint64_t fail_at, llm_status status);
/* The same, except that a step that is to fail fails after the backend ran:
 * K/V and logits are written, as when a device reports an error at the end
 * of a step. Creates still fail before anything. */
void llmi_backend_fault_inject_late(uint64_t fail_at, llm_status status);
/* Backend calls since the last llmi_backend_fault_inject (or the process
 * start). */
uint64_t llmi_backend_fault_calls(void);
#endif
/* Counts one backend call: the armed one fails now (or, when `late` is not
 * NULL and the fault was armed late, sets *late and returns LLM_OK).
 * Always LLM_OK in a build without LLMI_TEST_HOOKS. */
llm_status llmi_backend_fault_check(bool *late);
/* The armed status and message, for a step whose check set *late. */
llm_status llmi_backend_fault_late(void);

#endif
