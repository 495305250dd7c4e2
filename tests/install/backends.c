/*
 * A downstream program that uses the experimental device API, built by
 * tests/install/run.sh against an installed libllminfer: prints one line
 * per backend it sees, "name: available (N devices)" or "name: reason".
 * run.sh checks the "cuda" line: the installed CUDA plug-in loads from
 * beside the library (or, for a program linked statically, through the
 * dynamic loader's search path).
 */
#define LLM_EXPERIMENTAL
#include <llm.h>

#include <stdio.h>

int main(void) {
    size_t n = llm_backend_count();
    for (size_t i = 0; i < n; i++) {
        llm_backend_info info = {.struct_size = sizeof info};
        llm_status st = llm_backend_get_info(i, &info);
        if (st != LLM_OK) {
            fprintf(stderr, "backends: llm_backend_get_info(%zu): %s: %s\n", i,
                    llm_status_name(st), llm_last_error());
            return 1;
        }
        if (info.available)
            printf("%s: available (%u devices)\n", info.name, info.n_devices);
        else
            printf("%s: %s\n", info.name, info.reason);
    }
    return 0;
}
