/* The tiny model fuzz_state.c loads states into, shared with make_corpus.c
 * so the seed states carry its fingerprint. Header-only. */
#ifndef FUZZ_STATE_H
#define FUZZ_STATE_H

#include "model/model.h"
#include "model/testmodel.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* One layer, one KV head of 32 (the smallest head the block KV types take,
 * FP8 included): a token takes 260 payload bytes in F32, so seeds stay
 * small and the fuzzer's mutations land in every part of a record. */
static inline void fuzz_state_model_params(llmi_testmodel_params *p) {
    llmi_testmodel_params_init(p);
    p->n_layer = 1;
    p->n_embd = 16;
    p->n_head = 2;
    p->n_head_kv = 1;
    p->head_dim = 32;
    p->n_ff = 16;
    p->n_ctx = 64;
    p->name = "fuzz-state";
}

/* Writes the model to a memfd and loads it by path; NULL on failure. */
static inline llm_model *fuzz_state_model(void) {
    llmi_testmodel_params p;
    fuzz_state_model_params(&p);
    void *data = NULL;
    size_t size = 0;
    if (llmi_testmodel_to_memory(&p, &data, &size) != LLM_OK)
        return NULL;
    int fd = memfd_create("fuzz_state_model", 0);
    llm_model *m = NULL;
    if (fd >= 0 && write(fd, data, size) == (ssize_t)size) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (llmi_model_load(path, false, &m) != LLM_OK)
            m = NULL;
    }
    if (fd >= 0)
        close(fd);
    llmi_free(data);
    return m;
}

#endif
