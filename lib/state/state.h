/* Durable session state: token-level sequences (their tokens and K/V) saved
 * to bytes or files and loaded back into a session on the same model, in
 * this process or a later one.
 *
 * Format, version 3. Integers are little-endian; offsets in bytes.
 *
 *   header
 *     0   char[8]  magic "LLMSTATE"
 *     8   u32      format version (3; 2 and 1 as older libraries wrote
 *                  them still load; a newer one gives LLM_ERR_UNSUPPORTED)
 *     12  u32      header length H, every CRC included (88 + name length;
 *                  version 1: 84 + name length)
 *     16  u32      kind: 1 = one sequence, 2 = a session's sequences
 *     20  u32      N = length of the model's general.name
 *     24  u8[N]    general.name, no NUL (for messages; identity is below)
 *     24+N
 *         u64      model fingerprint (llmi_model_fingerprint)
 *         u32      n_layer
 *         u32      kv_dim = n_head_kv * head_dim
 *         u32      n_vocab
 *         u32      KV element type: llm_kv_type (0 f32, 1 f16, 2 bf16;
 *                  since 1.4 also 3 q8_0, 4 q4_0, which older libraries
 *                  refuse as an unknown type: files of types 0-2 were
 *                  unchanged, so the version stayed 2)
 *         u32      R = record count (kind 1: exactly 1)
 *         u64      T = tokens over all records
 *         u64      raw payload length = h R + T (4 + 2 n_layer r),
 *                  h = 20 (versions 1 and 2: 8) record head bytes,
 *                  r = bytes of a row of kv_dim elements: 4 or 2 per
 *                  element, 34 (q8_0) or 18 (q4_0) per block of 32
 *         u64      compressed payload length = file length - H
 *         u32      CRC-32 of the raw payload
 *         u32      CRC-32 of the compressed payload (versions 2 and 3)
 *     H-4 u32      CRC-32 of header bytes [0, H - 4)
 *   payload: a zlib stream (RFC 1950, deflate level 1) of R records:
 *         i32      sequence id (kind 2: the id it is loaded under)
 *         u32      n = tokens of the sequence
 *         u64      fingerprint of the LoRA adapter its K/V were computed
 *                  with (llm_adapter.fingerprint), 0 for none (version 3;
 *                  versions 1 and 2 have neither field: no adapter)
 *         f32      that adapter's scale; 0 when there is none (version 3)
 *         i32[n]   the tokens
 *         then for each layer: K rows of positions 0..n-1, then V rows of
 *         positions 0..n-1; a row is kv_dim elements of the KV type
 *         (q8_0 and q4_0: GGUF's blocks, as the session's cache holds
 *         them, so a state saved and loaded in one type is exact).
 *
 * Why both payload CRCs: a deflate stream has bits that change no output
 * byte (the code lengths of symbols a block never uses, for one), so the
 * raw CRC alone lets some altered files load with their original content.
 * The compressed CRC refuses every altered byte; a version 1 state, which
 * lacks it, still loads with the raw check only.
 *
 * Level 1 because K/V values are noisy floats that deflate barely shrinks
 * (a few percent for f32, more for f16's exponent bytes) at any level;
 * only the fast level is worth its time. The payload is per token, not per
 * KV block, so a state loads into a session with any block size, and its
 * rows are converted when the session's KV type differs.
 *
 * Loading checks, before inflating anything: magic, header CRC, version,
 * header layout, compressed length against the bytes present, the model
 * (fingerprint), the kind, the raw length against the counts, then the
 * limits (n_ctx, free KV blocks, LLMI_STATE_MAX_RECORDS and
 * LLMI_STATE_MAX_SEQ_ID). Inflating never produces more than the raw
 * length the counts imply. A load is all or nothing: sequences are built
 * aside and published only after the payload's CRC matched.
 *
 * A record saved with an adapter loads as a sequence that waits for it:
 * adapters are not saved, only named, so the caller gives the same adapter
 * and scale with llm_seq_set_adapter (matched by fingerprint; two loads of
 * one file match), and until then every decode over the sequence or its
 * forks is refused with LLM_ERR_INVALID_ARGUMENT naming both. Saving a
 * waiting sequence keeps what it waits for.
 *
 * The scheduler's requests (llm_session_submit) and llm_generate's sequence
 * are not part of the state. */
#ifndef LLMI_STATE_H
#define LLMI_STATE_H

#include "session/session.h"

#define LLMI_STATE_MAGIC "LLMSTATE"
#define LLMI_STATE_VERSION 3u

enum {
    LLMI_STATE_KIND_SEQUENCE = 1,
    LLMI_STATE_KIND_SESSION = 2,
    /* Header bytes besides the model name: this version's, and version
     * 1's (no compressed-payload CRC), the smallest a header may be. */
    LLMI_STATE_HEADER_FIXED = 88,
    LLMI_STATE_HEADER_FIXED_V1 = 84,
    /* Bytes of a record before its tokens: this version's (id, count,
     * adapter fingerprint and scale) and versions 1 and 2's (id, count). */
    LLMI_STATE_RECORD_HEAD = 20,
    LLMI_STATE_RECORD_HEAD_V2 = 8,
    /* Largest header length accepted from any version. */
    LLMI_STATE_MAX_HEADER = 1 << 16,
    /* Longest model name a header may carry (a model keeps 127 bytes; the
     * rest of the limit is room for later versions). */
    LLMI_STATE_MAX_NAME = 1024,
};

/* Records of a session state, and the largest sequence id it may name (the
 * id table is allocated up to it). Ids are reused lowest first, so a
 * session's largest id is below the most sequences it had open at once. */
#define LLMI_STATE_MAX_RECORDS (1u << 16)
#define LLMI_STATE_MAX_SEQ_ID ((1 << 16) - 1)

/* Saves sequence *seq, or every open token-level sequence when seq is NULL,
 * into buf. buf NULL or capacity below the bound: LLM_ERR_BUFFER_TOO_SMALL
 * with *size = an upper bound of the size; else *size = bytes written. */
llm_status llmi_state_save(llm_session *s, const llm_seq_id *seq, void *buf, size_t capacity,
                           size_t *size);
/* Loads a state of one sequence (out != NULL: opened under a new id, *out)
 * or of a session (out == NULL: the session must have no open token-level
 * sequence; they are opened under their saved ids). */
llm_status llmi_state_load(llm_session *s, const void *data, size_t size, llm_seq_id *out);
/* The same through a file: written to PATH.tmp, fsync'ed, renamed to PATH
 * and the directory fsync'ed; read back in bounded chunks. */
llm_status llmi_state_save_file(llm_session *s, const llm_seq_id *seq, const char *path);
llm_status llmi_state_load_file(llm_session *s, const char *path, llm_seq_id *out);

#endif
