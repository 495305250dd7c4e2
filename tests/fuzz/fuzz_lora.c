/* libFuzzer target: LoRA adapter loading (model/adapter.c, hf/adapter.c)
 * from arbitrary bytes, for a fixed small model: a llama.cpp adapter GGUF,
 * or a PEFT config and safetensors pair (fuzz_lora.h says the layout).
 * Every refusal must be a status with a message; an adapter that loads is
 * used in a two-token greedy generation, so a shape the loader let through
 * wrongly shows up as an out-of-bounds access in the CPU step's LoRA
 * update. Seeds (tests/fuzz/corpus/lora) come from make_corpus.c. */
#include "hf/hf.h"
#include "model/adapter.h"
#include "session/session.h"

#include "fuzz_lora.h"
#include "fuzz_util.h"

static llm_model *g_model;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    llmi_testmodel_params p;
    fuzz_lora_model_params(&p);
    void *data = NULL;
    size_t size = 0;
    llmi_gguf *g = NULL;
    if (llmi_testmodel_to_memory(&p, &data, &size) != LLM_OK ||
        llmi_gguf_open_memory(data, size, &g) != LLM_OK) {
        fprintf(stderr, "fuzz_lora: test model: %s\n", llmi_error_message());
        abort();
    }
    llmi_gguf_close(g);
    char path[] = "/tmp/fuzz_lora_model_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0 ||
        llmi_model_load(path, false, &g_model) != LLM_OK) {
        fprintf(stderr, "fuzz_lora: cannot load the test model\n");
        abort();
    }
    remove(path);
    llmi_free(data);
    return 0;
}

static void use_adapter(const llm_adapter *a) {
    FUZZ_CHECK(a->n_pairs > 0 && a->max_rank > 0, "adapter with %u pairs, rank %u", a->n_pairs,
               a->max_rank);
    llm_session_params sp;
    llm_session_params_init(&sp);
    sp.n_threads = 1;
    sp.n_ctx = 32;
    sp.max_batch_tokens = 8;
    llm_session *s = NULL;
    llm_status st = llmi_session_create(g_model, &sp, &s);
    FUZZ_CHECK(st == LLM_OK, "session %d: %s", st, llmi_error_message());
    llm_generate_params gp;
    llm_generate_params_init(&gp);
    gp.max_new_tokens = 2;
    gp.adapter = a;
    const llm_token prompt[3] = {1, 2, 3};
    st = llm_generate(s, prompt, 3, &gp, NULL);
    FUZZ_CHECK(st == LLM_OK, "generate %d: %s", st, llmi_error_message());
    llmi_session_free(s);
}

static llm_status open_input(uint8_t *data, size_t size, llmi_gguf **g) {
    if (data[0] == FUZZ_LORA_PEFT) {
        if (size < 3)
            return LLM_ERR_INVALID_ARGUMENT;
        size_t n = (size_t)data[1] | (size_t)data[2] << 8;
        if (n > size - 3)
            return LLM_ERR_INVALID_ARGUMENT;
        const llmi_hparams *hp = &g_model->hp;
        llmi_hf_adapter_shape shape = {hp->arch, true, hp->n_head, hp->n_head_kv};
        return llmi_hf_adapter_from_memory((const char *)data + 3, n, data + 3 + n, size - 3 - n,
                                           &shape, g);
    }
    /* The GGUF moved to the start of the copy: aligned, as a mapping is. */
    memmove(data, data + 1, size - 1);
    return llmi_gguf_open_memory(data, size - 1, g);
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size) {
    if (size < 1)
        return 0;
    uint8_t *data = malloc(size);
    if (!data)
        return 0;
    memcpy(data, input, size);
    llmi_error_clear();
    llmi_gguf *g = NULL;
    llm_status st = open_input(data, size, &g);
    if (st == LLM_ERR_INVALID_ARGUMENT && !g && llmi_error_message()[0] == '\0') {
        free(data);
        return 0; /* too short for its layout */
    }
    FUZZ_CHECK(st == LLM_OK || llmi_error_message()[0] != '\0', "status %d without a message", st);
    if (st != LLM_OK) {
        free(data);
        return 0;
    }
    llm_adapter *a = NULL;
    st = llmi_adapter_from_gguf(g_model, g, "fuzz", &a);
    FUZZ_CHECK(st == LLM_OK || llmi_error_message()[0] != '\0', "status %d without a message", st);
    FUZZ_CHECK((st == LLM_OK) == (a != NULL), "status %d with adapter %p", st, (void *)a);
    llmi_gguf_close(g);
    if (a)
        use_adapter(a);
    llmi_adapter_free(a);
    free(data);
    return 0;
}
