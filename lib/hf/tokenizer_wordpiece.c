/* tokenizer.json of a WordPiece (BERT-family) model: which normalizer and
 * pre-tokenizer it uses, the options lib/tokenizer/wordpiece.c needs as
 * tokenizer.wordpiece.* keys, and the vocabulary spelling llama.cpp's
 * converter writes for a "bert" vocabulary. Only BertNormalizer (or none)
 * and BertPreTokenizer are accepted: any other step would change the
 * tokens silently, so it is refused naming it. */
#include "hf/hf_internal.h"

#include <cjson/cJSON.h>
#include <string.h>

#define TJ "tokenizer.json"

static bool flag_or(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *type_name(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "?";
}

/* A Sequence holding exactly one step counts as that step. */
static const cJSON *only_step(const cJSON *o, const char *list_key) {
    if (o && strcmp(type_name(o), "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, list_key);
        if (cJSON_IsArray(list) && cJSON_GetArraySize(list) == 1)
            return cJSON_GetArrayItem(list, 0);
    }
    return o;
}

llm_status llmi_hf_wordpiece_options(const cJSON *root, const cJSON *model,
                                     llmi_hf_wordpiece *out) {
    memset(out, 0, sizeof *out);
    out->max_chars = 100;
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    if (prefix && !(cJSON_IsString(prefix) && strcmp(prefix->valuestring, "##") == 0))
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: a WordPiece continuing_subword_prefix other than \"##\" is not "
                          "supported",
                          TJ);
    const cJSON *mc = cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word");
    if (mc) {
        double d = cJSON_IsNumber(mc) ? mc->valuedouble : -1;
        if (!(d >= 1 && d <= 1e9) || d != (double)(uint32_t)d)
            return llmi_error(LLM_ERR_BAD_FORMAT,
                              "%s: model.max_input_chars_per_word is not a positive integer", TJ);
        out->max_chars = (uint32_t)d;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        norm = only_step(norm, "normalizers");
        if (strcmp(type_name(norm), "BertNormalizer") != 0)
            return llmi_error(LLM_ERR_UNSUPPORTED,
                              "%s: normalizer '%s' is not supported with WordPiece (only "
                              "BertNormalizer)",
                              TJ, type_name(norm));
        out->clean_text = flag_or(norm, "clean_text", true);
        out->chinese_chars = flag_or(norm, "handle_chinese_chars", true);
        out->lowercase = flag_or(norm, "lowercase", true);
        /* strip_accents null: follows lowercase, as in tokenizers */
        out->strip_accents = flag_or(norm, "strip_accents", out->lowercase);
    }
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    pre = only_step(pre, "pretokenizers");
    if (!pre || cJSON_IsNull(pre) || strcmp(type_name(pre), "BertPreTokenizer") != 0)
        return llmi_error(LLM_ERR_UNSUPPORTED,
                          "%s: pre_tokenizer '%s' is not supported with WordPiece (only "
                          "BertPreTokenizer)",
                          TJ, pre && !cJSON_IsNull(pre) ? type_name(pre) : "null");
    return LLM_OK;
}

char *llmi_hf_wordpiece_spelling(const char *s) {
    size_t n = strlen(s);
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']')
        return llmi_strdup(s);
    if (n >= 2 && s[0] == '#' && s[1] == '#')
        return llmi_strdup(s + 2);
    char *o = llmi_malloc(n + 4);
    if (o) {
        memcpy(o, "\xe2\x96\x81", 3);
        memcpy(o + 3, s, n + 1);
    }
    return o;
}

llm_status llmi_hf_wordpiece_write(const llmi_hf_wordpiece *wp, llmi_gguf_writer *w) {
    LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.wordpiece.clean_text", wp->clean_text));
    LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.wordpiece.chinese_chars", wp->chinese_chars));
    LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.wordpiece.strip_accents", wp->strip_accents));
    LLMI_TRY(llmi_gguf_w_bool(w, "tokenizer.wordpiece.lowercase", wp->lowercase));
    return llmi_gguf_w_u32(w, "tokenizer.wordpiece.max_input_chars_per_word", wp->max_chars);
}
