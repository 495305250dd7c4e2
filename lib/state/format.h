/* Private to lib/state: what save.c, load.c and format.c share. The byte
 * layout lives here (fields, CRCs, the header); the format itself is
 * described in state.h. */
#ifndef LLMI_STATE_FORMAT_H
#define LLMI_STATE_FORMAT_H

#include "state/state.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

/* K/V rows and tokens are copied in host order. The library already needs
 * a little-endian host (GGUF weights are used in place). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "lib/state assumes a little-endian host"
#endif

enum {
    LLMI_STATE_CHUNK = 1 << 18, /* file I/O and compressed-input chunk */
    LLMI_STATE_ZMAX = 1 << 30,  /* largest avail_in / avail_out handed to zlib (uInt) */
};

/* ---- little-endian fields ---- */

static inline void llmi_state_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void llmi_state_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t llmi_state_get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t llmi_state_get_u64(const uint8_t *p) {
    return llmi_state_get_u32(p) | (uint64_t)llmi_state_get_u32(p + 4) << 32;
}

/* CRC-32 of any length (zlib's crc32 takes uInt lengths). */
uint32_t llmi_state_crc_update(uint32_t crc, const void *data, size_t n);

/* Points z's allocator at llmi_calloc / llmi_free; before deflateInit or
 * inflateInit. */
void llmi_state_zlib_hooks(z_stream *z);

/* LLM_ERR_IO with "WHAT 'PATH': strerror(err)". */
llm_status llmi_state_io_error(const char *what, const char *path, int err);

/* ---- header ---- */

typedef struct llmi_state_header {
    uint32_t version, header_len, kind, name_len;
    char name[128]; /* printable copy for messages, possibly cut */
    uint64_t fingerprint;
    uint32_t n_layer, kv_dim, n_vocab, kv_type, n_records;
    uint64_t n_tokens, raw_len, comp_len;
    uint32_t crc;      /* of the raw payload */
    uint32_t comp_crc; /* of the compressed payload (version >= 2) */
} llmi_state_header;

/* Header bytes besides the model name in a header of `version`. */
static inline uint32_t llmi_state_header_fixed(uint32_t version) {
    return version >= 2 ? LLMI_STATE_HEADER_FIXED : LLMI_STATE_HEADER_FIXED_V1;
}

/* Bytes before a record's tokens: id and token count, then (version 3)
 * the adapter's fingerprint and scale. */
static inline uint32_t llmi_state_record_head(uint32_t version) {
    return version >= 3 ? LLMI_STATE_RECORD_HEAD : LLMI_STATE_RECORD_HEAD_V2;
}

/* The raw length R records of T tokens take; false on overflow. */
bool llmi_state_raw_length(const llmi_state_header *h, uint64_t *out);

/* Serialises h (its comp_len and crc as they are) with header CRC; returns
 * the length, h->header_len. */
size_t llmi_state_header_write(const llmi_state_header *h, const char *name, uint8_t *p);

/* Reads the first 16 bytes: magic and header length. */
llm_status llmi_state_header_start(const uint8_t *p, size_t avail, uint32_t *header_len);

/* Parses and checks the header bytes by themselves: CRC, version, layout. */
llm_status llmi_state_header_read(const uint8_t *p, size_t avail, llmi_state_header *h);

/* Checks a header against the session, before any payload byte is read.
 * `payload` is the number of bytes after the header. */
llm_status llmi_state_header_check(llm_session *s, const llmi_state_header *h, uint32_t want_kind,
                                   uint64_t payload);

#endif
