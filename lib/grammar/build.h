/* The grammar builder: rules as lists of alternatives, each a growable run
 * of elements, before compile.c flattens them into an llmi_grammar. Shared
 * by the EBNF parser and the compiler; not part of the module's interface. */
#ifndef LLMI_GRAMMAR_BUILD_H
#define LLMI_GRAMMAR_BUILD_H

#include "grammar/grammar.h"

typedef struct llmi_gseq {
    llmi_gel *v;
    uint32_t n, cap;
} llmi_gseq;

typedef struct llmi_gbrule {
    char *name;
    llmi_gseq *alts;
    uint32_t n_alts, cap_alts;
    bool defined;
    uint32_t ref_line, ref_col; /* first reference, for "undefined rule" */
} llmi_gbrule;

struct llmi_gbuild {
    llmi_gbrule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *ranges; /* pairs */
    uint32_t n_ranges, cap_ranges;
    llmi_gclass *cls;
    uint32_t n_cls, cap_cls;
    uint32_t n_synth; /* counter for names of generated rules */
};

void llmi_gbuild_free(llmi_gbuild *b);
/* Index of the rule called name (created, undefined, when new); UINT32_MAX
 * on allocation failure. */
uint32_t llmi_gbuild_rule(llmi_gbuild *b, const char *name, size_t len);
/* A new rule named after `base` with a unique suffix; UINT32_MAX on failure. */
uint32_t llmi_gbuild_synth(llmi_gbuild *b, const char *base);
/* Appends an empty alternative to rule r; NULL on allocation failure. The
 * pointer is valid until the rule gets another alternative. */
llmi_gseq *llmi_gbuild_alt(llmi_gbuild *b, uint32_t r);
llm_status llmi_gseq_push(llmi_gseq *s, uint32_t kind, uint32_t arg);
llm_status llmi_gseq_append(llmi_gseq *s, const llmi_gseq *from);
/* A class from n (lo, hi) pairs, in any order, overlapping or not;
 * `negate` takes the complement over U+0000..U+10FFFF. */
llm_status llmi_gbuild_class(llmi_gbuild *b, const uint32_t *pairs, uint32_t n, bool negate,
                             uint32_t *out);

#endif
