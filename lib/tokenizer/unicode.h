/* Unicode character data for the WordPiece (BERT) normalizer and
 * pre-tokenizer: categories, accent stripping, lowercasing. The tables are
 * generated (scripts/gen_unicode_tables.py, lib/tokenizer/unicode_tables.c);
 * the lookups are in wordpiece.c. Internal to lib/tokenizer. */
#ifndef LLMI_TOKENIZER_UNICODE_H
#define LLMI_TOKENIZER_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct llmi_uc_range {
    uint32_t first, last; /* inclusive */
} llmi_uc_range;
typedef struct llmi_uc_pair {
    uint32_t cp, to;
} llmi_uc_pair;
/* A code point's canonical decomposition without its Mn marks: up to three
 * code points, unused ones 0 (none at all: the character is a mark). */
typedef struct llmi_uc_strip_row {
    uint32_t cp, to[3];
} llmi_uc_strip_row;

/* All sorted by code point. */
extern const llmi_uc_range llmi_uc_mn[], llmi_uc_punct[], llmi_uc_other[];
extern const size_t llmi_uc_mn_n, llmi_uc_punct_n, llmi_uc_other_n;
extern const llmi_uc_strip_row llmi_uc_strip[];
extern const size_t llmi_uc_strip_n;
extern const llmi_uc_pair llmi_uc_lower[];
extern const size_t llmi_uc_lower_n;

#endif
