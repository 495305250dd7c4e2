/* Tokenizers read from GGUF metadata: byte-level BPE ("gpt2", with the
 * pre-tokenizer the file names) and SentencePiece-style BPE ("llama");
 * special tokens; detokenization; chat templates. */
#ifndef LLMI_TOKENIZER_H
#define LLMI_TOKENIZER_H

#include "core/core.h"
#include "gguf/gguf.h"

#include <stdbool.h>

typedef struct llmi_tokenizer llmi_tokenizer;

/* Token attributes from tokenizer.ggml.token_type (GGUF values). */
enum {
    LLMI_TOKTYPE_NORMAL = 1,
    LLMI_TOKTYPE_UNKNOWN = 2,
    LLMI_TOKTYPE_CONTROL = 3,
    LLMI_TOKTYPE_USER_DEFINED = 4,
    LLMI_TOKTYPE_UNUSED = 5,
    LLMI_TOKTYPE_BYTE = 6,
};

/* Builds the tokenizer from tokenizer.ggml.* keys (model, pre, tokens, scores,
 * token_type, merges, bos/eos/eot/unknown/padding ids, add_bos/add_eos,
 * chat_template). Missing or inconsistent keys: LLM_ERR_BAD_FORMAT naming the
 * key; an unknown model or pre-tokenizer: LLM_ERR_UNSUPPORTED. */
llm_status llmi_tokenizer_load(const llmi_gguf *g, llmi_tokenizer **out);
void llmi_tokenizer_free(llmi_tokenizer *t);

uint32_t llmi_tokenizer_n_vocab(const llmi_tokenizer *t);
llm_token llmi_tokenizer_bos(const llmi_tokenizer *t); /* LLM_TOKEN_NONE if absent */
llm_token llmi_tokenizer_eos(const llmi_tokenizer *t);
llm_token llmi_tokenizer_eot(const llmi_tokenizer *t);
llm_token llmi_tokenizer_pad(const llmi_tokenizer *t);
/* True for tokens that end generation (EOS, EOT and other end-of-generation
 * control tokens the vocabulary names, e.g. <|im_end|>, <|eot_id|>). */
bool llmi_tokenizer_is_eog(const llmi_tokenizer *t, llm_token id);
bool llmi_tokenizer_is_control(const llmi_tokenizer *t, llm_token id);
/* The model's chat template text, or NULL. */
const char *llmi_tokenizer_chat_template(const llmi_tokenizer *t);
/* The template named `name` (tokenizer.chat_template.<name>; NULL or
 * "default": the default one), or NULL. */
const char *llmi_tokenizer_chat_template_named(const llmi_tokenizer *t, const char *name);

/* Same contract as llm_tokenize() (flags LLM_TOKENIZE_*). */
llm_status llmi_tokenize(const llmi_tokenizer *t, const char *text, size_t len, uint32_t flags,
                         llm_token *out, size_t capacity, size_t *n_out);

/* Raw bytes of one token (BPE byte mapping undone, SentencePiece "\xe2\x96\x81"
 * turned into spaces, <0xNN> byte tokens into their byte). Control tokens give
 * their text only with LLM_DETOKENIZE_SPECIAL, else zero bytes. Not
 * NUL-terminated. An out-of-range id: LLM_ERR_INVALID_ARGUMENT. */
llm_status llmi_token_bytes(const llmi_tokenizer *t, llm_token id, uint32_t flags,
                            const char **bytes, size_t *n);

/* Incremental detokenizer state; holds back incomplete UTF-8 characters. */
typedef struct llmi_detok {
    const llmi_tokenizer *tok;
    uint32_t flags;
    bool first; /* SentencePiece drops the leading space of the first piece */
    unsigned char pending[8];
    size_t n_pending;
} llmi_detok;
void llmi_detok_init(llmi_detok *d, const llmi_tokenizer *t, uint32_t flags);
/* Writes the text completed by `id` at the start of buf (NUL-terminated). On
 * LLM_ERR_BUFFER_TOO_SMALL the state is unchanged and *n = needed length. */
llm_status llmi_detok_push(llmi_detok *d, llm_token id, char *buf, size_t cap, size_t *n);
llm_status llmi_detok_flush(llmi_detok *d, char *buf, size_t cap, size_t *n);

/* Same contract as llm_chat_template_apply(): the model's template run by
 * the Jinja interpreter (lib/jinja), or a built-in family when the
 * template is a family's name ("chatml", "llama3"). */
llm_status llmi_chat_apply(const llmi_tokenizer *t, const llm_chat_message *msgs, size_t n,
                           bool add_generation_prompt, char *buf, size_t cap, size_t *n_out);
/* Same contract as llm_chat_apply(); `p` is a complete, checked struct. */
llm_status llmi_chat_apply_json(const llmi_tokenizer *t, const llm_chat_params *p, char *buf,
                                size_t cap, size_t *n_out);
/* The built-in renderers (chat.c) for template text `tmpl`: a family
 * recognised by its text, else LLM_ERR_UNSUPPORTED. */
llm_status llmi_chat_apply_builtin(const llmi_tokenizer *t, const char *tmpl,
                                   const llm_chat_message *msgs, size_t n,
                                   bool add_generation_prompt, char *buf, size_t cap,
                                   size_t *n_out);

/* ---- additions ---- */

/* Whole-sequence detokenization, same contract as llm_detokenize(): the
 * result equals pushing every token through an llmi_detok and flushing. */
llm_status llmi_detokenize(const llmi_tokenizer *t, const llm_token *tokens, size_t n,
                           uint32_t flags, char *buf, size_t cap, size_t *n_out);
/* The vocabulary text of a token as stored in the file (BPE byte-mapped,
 * SentencePiece with U+2581), not NUL-terminated; NULL for a bad id. */
const char *llmi_tokenizer_token_text(const llmi_tokenizer *t, llm_token id, size_t *len);
/* tokenizer.ggml.token_type value of a token (LLMI_TOKTYPE_*), 0 for a bad id. */
int llmi_tokenizer_token_type(const llmi_tokenizer *t, llm_token id);
/* Whether LLM_TOKENIZE_ADD_SPECIAL adds BOS / EOS for this model. */
bool llmi_tokenizer_add_bos(const llmi_tokenizer *t);
bool llmi_tokenizer_add_eos(const llmi_tokenizer *t);

#ifdef LLMI_TOKENIZER_INTERNAL
/* ---- shared by the lib/tokenizer sources only (and white-box tests) ---- */

/* Token attributes (llama.cpp's llama_token_attr, which the file's
 * token_type and a few name-based rules produce). */
enum {
    LLMI_ATTR_UNKNOWN = 1u << 0,
    LLMI_ATTR_UNUSED = 1u << 1,
    LLMI_ATTR_NORMAL = 1u << 2,
    LLMI_ATTR_CONTROL = 1u << 3,
    LLMI_ATTR_USER_DEFINED = 1u << 4,
    LLMI_ATTR_BYTE = 1u << 5,
};

typedef enum llmi_tok_model {
    LLMI_TOKMODEL_BPE = 1,
    LLMI_TOKMODEL_SPM = 2,
    LLMI_TOKMODEL_WPM = 3, /* WordPiece ("bert") */
} llmi_tok_model;

/* Pre-tokenizer families (which regex list splits text before BPE). */
typedef enum llmi_tok_pre {
    LLMI_PRE_NONE = 0,  /* SentencePiece: no split */
    LLMI_PRE_DEFAULT,   /* llama.cpp's fallback list */
    LLMI_PRE_GPT2,      /* "gpt-2" and alikes */
    LLMI_PRE_LLAMA3,    /* "llama-bpe", "llama3", ... */
    LLMI_PRE_QWEN2,     /* "qwen2", ... */
    LLMI_PRE_STARCODER, /* "smollm", "starcoder", "refact", ...: digits, then GPT-2 */
} llmi_tok_pre;

/* Open-addressing hash set of token ids keyed by their text: slots hold
 * id + 1 (0 = empty); texts are compared in the tokenizer's text pool. */
typedef struct llmi_tok_strmap {
    uint32_t *slots;
    uint32_t mask;
} llmi_tok_strmap;
/* Open-addressing map from a (left, right) token-id pair to a merge. */
typedef struct llmi_tok_pairmap {
    uint64_t *keys;  /* (left << 32 | right) + 1; 0 = empty */
    uint32_t *rank;  /* merge priority: line number in tokenizer.ggml.merges */
    int32_t *result; /* id of the merged text, -1 if not in the vocabulary */
    uint32_t mask;
} llmi_tok_pairmap;

uint64_t llmi_tok_hash(const void *p, size_t n);

struct llmi_tokenizer {
    llmi_tok_model model;
    llmi_tok_pre pre;
    uint32_t n_vocab;
    char *text;          /* all token texts back to back */
    uint32_t *text_off;  /* n_vocab + 1 offsets into text */
    char *piece;         /* decoded bytes of every token (see llmi_token_bytes) */
    uint32_t *piece_off; /* n_vocab + 1 offsets into piece */
    float *score;
    uint16_t *attr;
    uint8_t *type; /* file token_type, clamped to 0..255 */
    uint8_t *eog;  /* 1 = ends generation */
    llmi_tok_strmap map;
    llmi_tok_pairmap merges;
    int32_t byte_tok[256]; /* BPE: token of a byte's mapped char; SPM: <0xNN> */
    int32_t *special;      /* control/user-defined/unknown ids, longest text first */
    uint32_t n_special;
    void *re[4]; /* pcre2_code_8 *, applied in order */
    uint32_t n_re;
    void *gctx; /* pcre2_general_context_8 * using llmi_malloc */
    llm_token bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    /* WordPiece: BertNormalizer's switches, max_input_chars_per_word */
    bool wpm_clean_text, wpm_chinese, wpm_strip_accents, wpm_lowercase;
    uint32_t wpm_max_chars;
    uint32_t wpm_max_bytes; /* the longest token text, bounding candidate pieces */
    char *chat_template;
    /* named templates (tokenizer.chat_template.<name>, e.g. "tool_use"):
     * name and text alternate */
    char **named_templates;
    size_t n_named_templates;
};

static inline uint32_t llmi_tok_len(const llmi_tokenizer *t, llm_token id) {
    return t->text_off[id + 1] - t->text_off[id];
}
static inline const char *llmi_tok_str(const llmi_tokenizer *t, llm_token id) {
    return t->text + t->text_off[id];
}
/* Token with exactly this text, or -1 (base.c, like llmi_tokvec_push and
 * llmi_tok_hash: the files every other file of the module may use). */
llm_token llmi_tok_find(const llmi_tokenizer *t, const char *s, size_t n);

/* Growable token vector used while tokenizing. */
typedef struct llmi_tokvec {
    llm_token *v;
    size_t n, cap;
} llmi_tokvec;
llm_status llmi_tokvec_push(llmi_tokvec *tv, llm_token id);

/* bpe.c: regexes and merges for a "gpt2" model; tokenizes one fragment
 * (text without special tokens) and appends to out. *dropped = offset of
 * the first byte that got no token (llama.cpp drops it), else SIZE_MAX. */
llm_status llmi_bpe_init(llmi_tokenizer *t, const llmi_gguf *g, const char *pre_name);
void llmi_bpe_free(llmi_tokenizer *t);
llm_status llmi_bpe_tokenize(const llmi_tokenizer *t, const char *text, size_t len,
                             llmi_tokvec *out, size_t *dropped);
/* The merge table from tokenizer.ggml.merges ("left right" lines; entries
 * naming unknown tokens are skipped), and a lookup in it: the pair's rank
 * (line number) and the id of the merged text (-1 if not in the vocabulary). */
llm_status llmi_bpe_load_merges(llmi_tokenizer *t, const llmi_gguf_kv *kv);
bool llmi_bpe_merge_find(const llmi_tokenizer *t, llm_token l, llm_token r, uint32_t *rank,
                         int32_t *result);
/* GPT-2 bytes_to_unicode: the code point standing for byte b. */
uint32_t llmi_bpe_byte_cp(uint8_t b);
/* Inverse: byte of a mapped code point, or -1. */
int llmi_bpe_cp_byte(uint32_t cp);

/* spm.c: SentencePiece-style BPE on one fragment (spaces already U+2581).
 * With a merge table (a "llama" file that has tokenizer.ggml.merges, as
 * tokenizer.json folders give) only listed pairs merge, lowest rank first,
 * as Hugging Face's BPE does; without one, by score.
 * *dropped = offset of the first byte without a token of its own (dropped,
 * or the unknown token where the vocabulary has one), else SIZE_MAX. */
llm_status llmi_spm_tokenize(const llmi_tokenizer *t, const char *text, size_t len,
                             llmi_tokvec *out, size_t *dropped);

/* wordpiece.c: a "bert" vocabulary's options (tokenizer.wordpiece.* keys:
 * clean_text, chinese_chars, strip_accents, lowercase, all true when absent;
 * max_input_chars_per_word, 100), and WordPiece on one fragment: BERT's
 * normalizer and pre-tokenizer, then greedy longest-match pieces. Tokens
 * starting a word are spelled with a leading U+2581, continuation pieces
 * without "##" (llama.cpp's spelling). *dropped = offset of the first input
 * byte of a word that became the unknown token, else SIZE_MAX. */
llm_status llmi_wpm_init(llmi_tokenizer *t, const llmi_gguf *g);
llm_status llmi_wpm_tokenize(const llmi_tokenizer *t, const char *text, size_t len,
                             llmi_tokvec *out, size_t *dropped);

/* UTF-8 helpers shared by the module (base.c). */
size_t llmi_tok_utf8_encode(uint32_t cp, char *out); /* 1-4 bytes */
/* Decodes one valid sequence (input already validated); returns its length. */
size_t llmi_tok_utf8_decode(const char *s, size_t n, uint32_t *cp);

#endif /* LLMI_TOKENIZER_INTERNAL */

#endif
