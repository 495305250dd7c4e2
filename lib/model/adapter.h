/* Low-rank adapters (LoRA) of a model: for each projection an adapter
 * targets, two small matrices A (rank x in) and B (out x rank) whose product
 * is added to the base weight's output,
 *     y = W x + scale * (alpha / rank) * B (A x),
 * without ever forming W + B A: one model serves many adapters, and the
 * rows of each request take their own update (docs/lora.md).
 *
 * Read from llama.cpp's LoRA GGUF layout (general.type "adapter",
 * adapter.type "lora", adapter.lora.alpha; tensors "<base weight>.lora_a"
 * with ne {in, rank} and "<base weight>.lora_b" with ne {rank, out}), or
 * from a Hugging Face PEFT folder, which lib/hf presents as that layout.
 * Weights are converted to F32 at load, whatever the file holds (F32, F16,
 * BF16). Immutable after load: steps on many threads read it. */
#ifndef LLMI_ADAPTER_H
#define LLMI_ADAPTER_H

#include "core/core.h"
#include "gguf/gguf.h"
#include "model/model.h"

/* The projections an adapter may target, in the order a layer runs them. */
typedef enum llmi_lora_target {
    LLMI_LORA_Q,
    LLMI_LORA_K,
    LLMI_LORA_V,
    LLMI_LORA_O,
    LLMI_LORA_GATE,
    LLMI_LORA_UP,
    LLMI_LORA_DOWN,
    LLMI_LORA_TARGETS
} llmi_lora_target;

/* The layer role (model/arch.h) of a target. */
llmi_layer_role llmi_lora_target_role(llmi_lora_target t);

/* One targeted projection: a = [rank][in] (A as stored) and b = [rank][out]
 * (B transposed, so the update adds `rank` whole rows), row-major F32.
 * a NULL: the adapter leaves this projection alone. */
typedef struct llmi_lora_pair {
    float *a, *b;
    uint32_t rank, in, out;
    float alpha_scale; /* alpha / rank (1 when the file gives no alpha) */
} llmi_lora_pair;

struct llm_adapter {
    const llm_model *model; /* the model it was loaded for (borrowed) */
    uint64_t id;            /* distinct for every adapter loaded in the process */
    /* A hash of what the adapter computes (each pair's place, shapes and
     * F32 matrices, and alpha): two loads of one file, or of a GGUF and a
     * PEFT folder holding the same weights, share it. Saved states name
     * the adapter a sequence needs by it (lib/state). Never 0. */
    uint64_t fingerprint;
    float alpha;           /* adapter.lora.alpha; 0 = none given */
    uint32_t n_pairs;      /* projections targeted */
    uint64_t bytes;        /* memory its matrices take */
    uint32_t max_rank;     /* the largest rank of any pair */
    llmi_lora_pair *pairs; /* [n_layer][LLMI_LORA_TARGETS] */
};

static inline const llmi_lora_pair *llmi_adapter_pair(const llm_adapter *a, uint32_t layer,
                                                      llmi_lora_target t) {
    return &a->pairs[(size_t)layer * LLMI_LORA_TARGETS + t];
}

/* Loads an adapter for `m` from a GGUF file or a PEFT folder (a directory
 * holding adapter_config.json). Errors: LLM_ERR_IO (unreadable),
 * LLM_ERR_BAD_FORMAT (not an adapter file, a pair missing its other half,
 * shapes that disagree with each other or with the base weight, rank 0),
 * LLM_ERR_UNSUPPORTED (another architecture, a tensor targeting a weight
 * this library cannot adapt, a weight type other than F32/F16/BF16, PEFT
 * options such as DoRA); every message names the tensor or field. */
llm_status llmi_adapter_load(const llm_model *m, const char *path, bool use_mmap,
                             llm_adapter **out);
/* The same from an opened GGUF (llama.cpp's layout), which the caller keeps
 * and closes; nothing of it is referenced afterwards (fuzzing, tests). */
llm_status llmi_adapter_from_gguf(const llm_model *m, const llmi_gguf *g, const char *what,
                                  llm_adapter **out);
/* NULL is a no-op. */
void llmi_adapter_free(llm_adapter *a);

/* The content fingerprint of a built adapter (its `fingerprint` field);
 * never 0, which stands for "no adapter" in saved states. */
uint64_t llmi_adapter_fingerprint(const llm_adapter *a);

/* The seed of the prefix-cache hash chain of a sequence computed with
 * adapter `a` at `scale` (0 for no adapter): K/V depend on both, so blocks
 * computed under one never match a prompt run under another. */
uint64_t llmi_adapter_chain_seed(const llm_adapter *a, float scale);

#endif
