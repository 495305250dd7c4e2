/* Grammar-constrained decoding: compiled grammars and per-sequence matchers.
 *
 * A grammar is a set of rules over Unicode code points, written in GBNF's
 * notation (ebnf.c), or compiled to that notation from a JSON Schema
 * (schema.c) or a regular expression (regex.c). Compiling flattens it into
 * an element array (below) that many sequences share read-only, plus a
 * trie over the token bytes of one vocabulary (vocab.c).
 *
 * A matcher (match.c) is a pushdown recognizer: its state is a set of
 * stacks; each stack is a chain of positions in the element array (the top
 * is the next character element to match, the rest are where to continue
 * once the rules above finish). Stack nodes live in an append-only arena
 * owned by the state, so stacks share their tails and a trial advance is
 * undone by truncating the arena. Code points arrive as UTF-8 bytes; a
 * token may end inside a character and the next one finish it.
 *
 * The allowed-token mask walks the vocabulary trie once, advancing the stack
 * set byte by byte and pruning every subtree the grammar rejects; the walk
 * memoizes its steps per distinct stack set and takes whole subtrees where
 * a set accepts every byte below them (walk.c). Binding the vocabulary
 * precomputes the part of each stack's mask its top frames decide
 * (posmask.c), so a mask only walks the few tokens the frames below them
 * decide (mask.c).
 *
 * Thread safety: a compiled grammar is immutable and may be used by many
 * states on many threads; one state is used by one thread at a time. */
#ifndef LLMI_GRAMMAR_H
#define LLMI_GRAMMAR_H

#include "core/core.h"
#include "tokenizer/tokenizer.h"

/* Element kinds. A rule's alternative is a run of CHAR and RULE elements
 * closed by END. */
enum { LLMI_GEL_END = 0, LLMI_GEL_CHAR = 1, LLMI_GEL_RULE = 2 };

typedef struct llmi_gel {
    uint32_t kind; /* LLMI_GEL_* */
    uint32_t arg;  /* CHAR: class index; RULE: rule index */
} llmi_gel;

/* A character class: sorted, disjoint, non-adjacent inclusive code point
 * ranges (negation already applied), and a bitmap of its ASCII members. */
typedef struct llmi_gclass {
    uint32_t first; /* index of its first range in llmi_grammar.ranges */
    uint32_t n;     /* number of ranges */
    uint64_t ascii[2];
} llmi_gclass;

typedef struct llmi_grule {
    uint32_t first_alt; /* index into llmi_grammar.alts */
    uint32_t n_alts;
} llmi_grule;

/* One node of the vocabulary trie: children are contiguous, sorted by byte. */
typedef struct llmi_gtrie_node {
    uint32_t first_child;
    uint16_t n_children;
    uint8_t byte;
    uint8_t all_text; /* every token of the subtree is text (llmi_gtoken_is_text) */
    /* Tokens whose bytes end here: trie_tokens[first_token, first_token +
     * n_tokens); the whole subtree's are trie_tokens[first_token, end_token). */
    uint32_t first_token;
    uint32_t n_tokens;
    uint32_t end_token;
    uint32_t depth; /* bytes from the root */
} llmi_gtrie_node;

typedef struct llmi_gvocab llmi_gvocab;

typedef struct llmi_gpostable llmi_gpostable;

/* The public llm_grammar handle is this struct. */
typedef struct llm_grammar {
    llmi_gel *el;
    uint32_t n_el;
    uint32_t *ranges; /* pairs lo, hi */
    uint32_t n_ranges;
    llmi_gclass *cls;
    uint32_t n_cls;
    uint32_t *alts; /* element index where each alternative starts */
    uint32_t n_alts;
    llmi_grule *rules;
    uint32_t n_rules;
    char **rule_names;
    uint32_t root;
    /* Vocabulary (llmi_grammar_bind_vocab / _model): borrowed from `vocab`,
     * of which the grammar holds a reference. */
    llmi_gvocab *vocab;
    uint32_t n_vocab;
    llmi_gtrie_node *trie; /* node 0 is the root (empty prefix) */
    uint32_t n_trie;
    llm_token *trie_tokens;
    llm_token *eog; /* end-of-generation tokens */
    uint32_t n_eog;
    uint32_t max_token_len;
    uint32_t *tok_off; /* token t's bytes: tok_bytes[tok_off[t], tok_off[t + 1]) */
    char *tok_bytes;
    uint32_t *text_tokens; /* bitset of the tokens that are text (llmi_gtoken_is_text) */
    /* LLMI_GTEXT_RUNS bitsets: [k] of the text tokens of at most k + 1
     * characters (bounded strings); the longest text token's characters. */
    uint32_t *text_upto;
    uint32_t max_text_chars;
    /* Per node: the byte groups (llmi_gbyte_group) of the bytes below it in
     * its tokens, LLMI_GGROUP_INVALID when a token of the subtree is not
     * UTF-8 the matcher could accept, and the most characters below it
     * (bytes other than continuation bytes; capped at 255,
     * llmi_gbelow_len). */
    uint64_t *trie_below;
    /* The masks of every chain of top positions a stack can have, built
     * when the vocabulary is bound (posmask.c); NULL for a grammar too
     * large for them, whose masks are walked from scratch. */
    llmi_gpostable *posmasks;
} llmi_grammar;

/* Whitespace between JSON tokens in grammars compiled from a schema. */
enum { LLMI_GRAMMAR_WS_COMPACT = 0, LLMI_GRAMMAR_WS_FLEXIBLE = 1 };

/* Compilers. Each leaves *out NULL on failure with the message naming the
 * place: line:column of the grammar text, the JSON pointer of a schema
 * keyword, the offset in a regular expression. Unsupported features give
 * LLM_ERR_UNSUPPORTED, malformed input LLM_ERR_INVALID_ARGUMENT. */
llm_status llmi_grammar_from_ebnf(const char *text, size_t len, const char *root,
                                  llmi_grammar **out);
llm_status llmi_grammar_from_regex(const char *re, size_t len, llmi_grammar **out);
llm_status llmi_grammar_from_schema(const char *json, size_t len, uint32_t ws_mode,
                                    llmi_grammar **out);
/* The GBNF text a schema or a regular expression compiles to, for tests and
 * debugging; caller frees *text with llmi_free. */
llm_status llmi_schema_to_ebnf(const char *json, size_t len, uint32_t ws_mode, char **text);
llm_status llmi_regex_to_ebnf(const char *re, size_t len, char **text);
void llmi_grammar_free(llmi_grammar *g);

/* Gives g the token bytes and trie of `tok`, built for g alone (tests),
 * or of model `m`, built once per model and shared (a second bind with a
 * vocabulary of another size fails), then builds its position masks
 * (posmask.c). */
llm_status llmi_grammar_bind_vocab(llmi_grammar *g, const llmi_tokenizer *tok);
llm_status llmi_grammar_bind_model(llmi_grammar *g, const llm_model *m);
/* The vocabulary part of the binds above (vocab.c), without the position
 * masks they then build (posmask.c). */
llm_status llmi_grammar_attach_vocab(llmi_grammar *g, const llmi_tokenizer *tok);
llm_status llmi_grammar_attach_model(llmi_grammar *g, const llm_model *m);
void llmi_gvocab_release(llmi_gvocab *v);

/* ---- matcher state ---- */

typedef struct llmi_gnode {
    uint32_t pos;    /* element index: the next element to match */
    uint32_t parent; /* node below it, or LLMI_GNONE */
    uint64_t hash;   /* of the chain from here down */
} llmi_gnode;

/* Special stack tops and parents: NONE ends a chain; DONE is a stack that
 * emptied (the grammar may end); CUT stands for "the rest of the stack",
 * unknown, in the position masks of posmask.c. */
enum { LLMI_GNONE = UINT32_MAX, LLMI_GDONE = UINT32_MAX - 1, LLMI_GCUT = UINT32_MAX - 2 };

/* Pending bytes of a code point split across tokens. */
typedef struct llmi_gutf8 {
    uint32_t acc;  /* bits so far */
    uint8_t need;  /* continuation bytes still to come; 0 = none pending */
    uint8_t total; /* length of the whole sequence */
} llmi_gutf8;

/* A snapshot for rollback: the stack tops and the pending bytes. */
typedef struct llmi_gsnap {
    uint32_t first_top; /* into llmi_gstate.snap_tops */
    uint32_t n_tops;
    llmi_gutf8 utf8;
    bool finished;
} llmi_gsnap;

/* The public llm_grammar_state handle is this struct. */
typedef struct llm_grammar_state {
    const llmi_grammar *g;
    llmi_gnode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *tops; /* stack tops (node index or LLMI_GDONE), then scratch */
    uint32_t n_tops, cap_tops;
    llmi_gutf8 utf8;
    bool finished; /* an end-of-generation token was accepted */
    bool no_cache; /* masks by the plain walk only (tests compare both) */
    /* Rollback history: the states before the last n_snaps tokens. */
    llmi_gsnap *snaps;
    uint32_t n_snaps, cap_snaps, max_snaps;
    uint32_t *snap_tops;
    uint32_t n_snap_tops, cap_snap_tops;
} llmi_gstate;

/* Most stacks a state may hold; more is LLM_ERR_LIMIT (an ambiguous
 * grammar). */
enum { LLMI_GRAMMAR_MAX_STACKS = 4096, LLMI_GRAMMAR_MAX_ROLLBACK = 64 };

llm_status llmi_gstate_create(const llmi_grammar *g, llmi_gstate **out);
llm_status llmi_gstate_fork(const llmi_gstate *s, llmi_gstate **out);
void llmi_gstate_free(llmi_gstate *s);
/* Advances by raw bytes; on rejection returns LLM_ERR_INVALID_ARGUMENT and
 * leaves the state unchanged. Takes no snapshot. */
llm_status llmi_gstate_accept_bytes(llmi_gstate *s, const char *bytes, size_t n);
/* Advances by one token of the bound vocabulary (end-of-generation tokens
 * are accepted where the grammar may end and finish it). Keeps a snapshot
 * for llmi_gstate_rollback. Rejection leaves the state unchanged. */
llm_status llmi_gstate_accept_token(llmi_gstate *s, llm_token t);
/* Whether the grammar may end here (every stack popped, no pending bytes). */
bool llmi_gstate_can_end(const llmi_gstate *s);
/* Whether the grammar can go no further: it may end and no character
 * continues it (or an end-of-generation token was accepted). */
bool llmi_gstate_is_complete(const llmi_gstate *s);
/* Undoes the last n accepted tokens (n <= the number kept, at most
 * LLMI_GRAMMAR_MAX_ROLLBACK). */
llm_status llmi_gstate_rollback(llmi_gstate *s, uint32_t n);
/* How many tokens llmi_gstate_rollback can undo now. */
uint32_t llmi_gstate_rollback_depth(const llmi_gstate *s);
/* Sets bit t of mask (ceil(n_vocab / 32) words, all written) for every
 * token the grammar allows next; end-of-generation tokens where it may end.
 * Scratch comes from the state's arena, which is restored afterwards. */
llm_status llmi_gstate_fill_mask(llmi_gstate *s, uint32_t *mask);
/* Whether token t is allowed next (without changing the state). */
bool llmi_gstate_allows(llmi_gstate *s, llm_token t);

/* ---- internal, shared between the grammar's files ---- */

/* Builder used by the EBNF parser (ebnf.c) and the flattening (compile.c). */
typedef struct llmi_gbuild llmi_gbuild;
llm_status llmi_gbuild_finish(llmi_gbuild *b, const char *root, llmi_grammar **out);

/* A growable text buffer. */
typedef struct llmi_gtext {
    char *s;
    size_t n, cap;
    bool oom;
} llmi_gtext;
void llmi_gtext_put(llmi_gtext *t, const char *s, size_t n);
void llmi_gtext_puts(llmi_gtext *t, const char *s);
void llmi_gtext_printf(llmi_gtext *t, const char *fmt, ...) LLMI_PRINTF(2, 3);
/* Appends code point cp as a GBNF string-literal character (escaped). */
void llmi_gtext_literal_char(llmi_gtext *t, uint32_t cp, bool in_class);

/* Appends a GBNF expression (in parentheses) matching regex `re` as a
 * whole; `json`: as the text inside a JSON string literal. Errors name
 * `where` and the offset. */
llm_status llmi_regex_emit(const char *re, size_t len, bool json, const char *where,
                           llmi_gtext *out);

/* Byte groups: a set of stacks that every byte of a group (for NONASCII:
 * every non-ASCII code point) leads back to accepts any run of them, so a
 * trie subtree whose lower bytes fall in such groups is accepted whole. */
enum {
    LLMI_GGROUP_LOWER = 0, /* a-z */
    LLMI_GGROUP_UPPER = 1, /* A-Z */
    LLMI_GGROUP_DIGIT = 2, /* 0-9; 3 to 35: space and each ASCII punctuation */
    LLMI_GGROUP_NONASCII = 61,
    LLMI_GGROUP_CONTROL = 62,
    LLMI_GGROUP_INVALID = 63
};
static inline uint32_t llmi_gbyte_group(uint8_t c) {
    if (c >= 0x80)
        return LLMI_GGROUP_NONASCII;
    if (c < 0x20 || c == 0x7F)
        return LLMI_GGROUP_CONTROL;
    if (c >= 'a' && c <= 'z')
        return LLMI_GGROUP_LOWER;
    if (c >= 'A' && c <= 'Z')
        return LLMI_GGROUP_UPPER;
    if (c >= '0' && c <= '9')
        return LLMI_GGROUP_DIGIT;
    if (c <= 0x2F)
        return 3 + (c - 0x20u); /* 3..18 */
    if (c <= 0x40)
        return 19 + (c - 0x3Au); /* 19..25 */
    if (c <= 0x60)
        return 26 + (c - 0x5Bu); /* 26..31 */
    return 32 + (c - 0x7Bu);     /* 32..35 */
}
enum { LLMI_GBELOW_LEN_SHIFT = 40, LLMI_GTEXT_RUNS = 16 };
#define LLMI_GBELOW_GROUPS (~(0xFFull << LLMI_GBELOW_LEN_SHIFT))
static inline uint32_t llmi_gbelow_len(uint64_t below) {
    return (uint32_t)(below >> LLMI_GBELOW_LEN_SHIFT) & 0xFF;
}
/* Whether b[0, n) is UTF-8 the matcher can accept: complete sequences,
 * the last one possibly cut short where a valid code point completes it. */
bool llmi_gtoken_utf8_ok(const uint8_t *b, uint32_t n);

/* Whether bytes b[0, n) are "text": characters that are printable ASCII
 * other than '"' and '\\', or any non-ASCII code point, the last one
 * possibly cut short (a prefix some valid code point completes). A set of
 * stacks that every such character leads back to (inside a JSON string, a
 * regex's .*) accepts every text token, which the mask then takes from
 * the vocabulary's bitset instead of walking its trie paths. */
bool llmi_gtoken_is_text(const uint8_t *b, uint32_t n);
/* The printable ASCII bytes of text. */
static inline bool llmi_gbyte_is_text(uint8_t c) {
    return c >= 0x20 && c < 0x7F && c != '"' && c != '\\';
}

/* One valid UTF-8 sequence at s (n bytes available): its length, or 0
 * when invalid (overlong, surrogate, truncated, above U+10FFFF). */
size_t llmi_grammar_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* ---- position masks (posmask.c) ----
 *
 * Most of a mask depends on the top few frames of each stack only (inside
 * a string: every token made of string characters). For every chain of
 * LLMI_GPOS_DEPTH top positions a stack can have (fewer where the stack
 * ends), the table keeps the tokens accepted without looking further down
 * and the trie subtrees whose tokens do look further down ("uncertain"),
 * which the mask then walks with the real stacks. */
enum {
    LLMI_GPOS_DEPTH = 3,
    LLMI_GPOS_KEY = 1 + LLMI_GPOS_DEPTH,
    LLMI_GPOS_MAX_CHAINS = 1 << 16,
    LLMI_GPOS_MAX_CALLERS = 4096
};

/* The result of a walk over stacks cut below their top frames. */
typedef struct llmi_gcut {
    uint32_t *accepted;  /* ceil(n_vocab / 32) + 1 words */
    uint32_t *uncertain; /* trie node ids */
    uint32_t n_uncertain;
} llmi_gcut;

/* One chain's mask. key: the chain's length, with bit 31 set when the
 * stack ends below it, then its positions from the top (UINT32_MAX past
 * the length). The accepted tokens are a bitset or, when shorter, a list. */
typedef struct llmi_gposmask {
    uint32_t key[LLMI_GPOS_KEY];
    const uint32_t *bits; /* ceil(n_vocab / 32) words (the table's, shared), or NULL */
    llm_token *list;
    uint32_t n_list;
    uint32_t *uncertain; /* trie node ids */
    uint32_t n_uncertain;
} llmi_gposmask;

/* Builds g->posmasks (g attached to a vocabulary; nothing when built). */
llm_status llmi_grammar_build_posmasks(llmi_grammar *g);
/* The table (postable.c): created empty for chains of `depth` positions;
 * insert gives a zeroed entry holding `key` for the caller to fill (kept
 * and freed with the table), or NULL when the key is there already, and
 * LLM_ERR_LIMIT past `max` entries. */
llm_status llmi_gpostable_create(uint32_t depth, llmi_gpostable **out);
llm_status llmi_gpostable_insert(llmi_gpostable *t, const uint32_t *key, uint32_t max,
                                 llmi_gposmask **out);
void llmi_gpostable_free(llmi_gpostable *t);
/* The mask of a chain, or NULL when the grammar has no such chain. */
const llmi_gposmask *llmi_gpostable_find(const llmi_gpostable *t, const uint32_t *key);
/* The chains' length, and how many chains there are. */
uint32_t llmi_gpostable_depth(const llmi_gpostable *t);
uint32_t llmi_gpostable_size(const llmi_gpostable *t);
/* The memory the table holds. */
size_t llmi_gpostable_bytes(const llmi_gpostable *t);
/* A bitset of `words` words equal to `bits`, stored once per table. */
llm_status llmi_gpostable_bits(llmi_gpostable *t, const uint32_t *bits, size_t words,
                               const uint32_t **out);

bool llmi_gclass_has(const llmi_grammar *g, uint32_t cls, uint32_t cp);

/* ---- the memoized walk (walk.c) ----
 *
 * A set of stacks (in s->tops[first, first + n)) with its pending UTF-8
 * bytes. */
typedef struct llmi_gset {
    uint32_t first, n;
    llmi_gutf8 u;
} llmi_gset;

/* The set after one byte, appended at s->tops' end (n == 0: rejected). */
llm_status llmi_gstate_step_byte(llmi_gstate *s, llmi_gset in, uint8_t byte, llmi_gset *out);

/* The matcher's pieces the mask (mask.c) builds on: the state's own set,
 * a stack node (its hash chained with llmi_gmix), a top added to the set
 * that starts at `first` and ends at s->n_tops (duplicates dropped), and a
 * uint32_t array grown to hold `need`. */
static inline llmi_gset llmi_gstate_live(const llmi_gstate *s) {
    return (llmi_gset){0, s->n_tops, s->utf8};
}
uint64_t llmi_gmix(uint64_t h, uint32_t pos);
llm_status llmi_gstate_new_node(llmi_gstate *s, uint32_t pos, uint32_t parent, uint32_t *out);
llm_status llmi_gstate_add_top(llmi_gstate *s, uint32_t first, uint32_t t);
bool llmi_ggrow32(uint32_t **p, uint32_t *cap, uint32_t need);
/* Whether two stacks hold the same positions (their nodes may differ). */
bool llmi_gstate_same_stack(const llmi_gstate *s, uint32_t a, uint32_t b);
/* Runs bytes from `in`; *out is the final set (n == 0: rejected). */
llm_status llmi_gstate_run_bytes(llmi_gstate *s, llmi_gset in, const char *bytes, size_t n,
                                 llmi_gset *out);

/* Walks the trie below `node` from set `in`, memoizing the step from each
 * distinct stack set by each byte (most trie paths revisit a handful of
 * sets: inside a string every plain character leads back to the same one).
 * With e NULL it sets the bits of the allowed tokens in `mask`; otherwise
 * it fills e's accepted tokens and uncertain subtrees (paths that reach a
 * cut stack), like the cut walk. The arena keeps what it appends: the
 * caller truncates it afterwards. *gave_up: the walk met more distinct
 * sets than it keeps; its output is incomplete and the caller walks
 * without memoizing instead. */
typedef struct llmi_gwalk llmi_gwalk;
llm_status llmi_gwalk_create(llmi_gwalk **out);
void llmi_gwalk_free(llmi_gwalk *w);
llm_status llmi_gwalk_run(llmi_gwalk *w, llmi_gstate *s, uint32_t node, llmi_gset in,
                          uint32_t *mask, llmi_gcut *e, uint32_t *cap, bool *gave_up);
/* The walk without memoizing, depth-first below trie node `node` from set
 * `in`: with e NULL it sets the bits of the allowed tokens in `mask`;
 * otherwise (stacks cut below their top frames) it fills e's accepted
 * tokens and records as uncertain, without entering them, the subtrees
 * where a path reaches the cut. The reference the tests compare with, and
 * the fallback of the memoized walk. */
llm_status llmi_gwalk_plain(llmi_gstate *s, uint32_t node, llmi_gset in, uint32_t *mask,
                            llmi_gcut *e, uint32_t *cap);

/* Sets the bits of the tokens allowed from set `in` in the trie subtrees
 * rooted at nodes[0, n) (each node's own tokens and those below it),
 * following each node's path from `in` through the memoized steps.
 * *gave_up: as llmi_gwalk_run; the bits set are right but may be
 * incomplete. */
llm_status llmi_gwalk_subtrees(llmi_gwalk *w, llmi_gstate *s, llmi_gset in, const uint32_t *nodes,
                               uint32_t n, uint32_t *mask, bool *gave_up);

#ifdef LLMI_TEST_HOOKS
/* Caps the distinct sets a walk keeps (0: the default), so tests reach
 * the fallback to the plain walk. Not thread-safe; tests only. */
void llmi_gwalk_test_max_states(uint32_t n);
/* Lowers the position masks' limits (0: the defaults) so tests reach the
 * shallower tables and the grammar without one; counts the masks whose
 * stacks had a chain missing from the table (none should). Tests only. */
void llmi_gpos_test_limits(uint32_t max_chains, uint32_t max_callers);
uint64_t llmi_gpos_test_misses(void);
#endif

#endif
