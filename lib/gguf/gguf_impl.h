/* What gguf.c and gguf_build.c share about an open llmi_gguf; nothing
 * outside lib/gguf includes it. */
#ifndef LLMI_GGUF_IMPL_H
#define LLMI_GGUF_IMPL_H

#include "gguf/gguf.h"

/* The public struct comes first so a llmi_gguf * is the allocation itself. */
typedef struct gguf_impl {
    llmi_gguf pub;
    const llmi_gguf_kv **kv_sorted; /* by key: binary search and duplicate check */
    const llmi_gguf_tensor **t_sorted;
    bool owned_aligned;
    /* An assembled gguf's memory and the function that frees it, both set by
     * gguf_build.c: a pointer, so the reader (gguf.c) does not depend on the
     * builder that depends on it. NULL for a file. */
    llmi_gguf_parts *parts;
    void (*release_parts)(llmi_gguf_parts *parts);
} gguf_impl;

/* Parses pub.base / pub.size into pub and the indexes. */
llm_status llmi_gguf_parse(gguf_impl *gi);
/* Sorts the tensor index and rejects duplicate names. */
llm_status llmi_gguf_index_tensors(gguf_impl *gi);
void llmi_gguf_impl_free(gguf_impl *gi);

#endif
