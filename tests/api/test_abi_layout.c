/*
 * Pins the binary layout of the public API in include/llm.h: the size,
 * alignment, field offsets, field sizes and field types of every public
 * struct (x86-64, LP64), the values of every public enum and flag, and the
 * version numbers.
 *
 * IF A NUMBER HERE MUST CHANGE, THE ABI BROKE. Programs built against
 * libllminfer.so.1 would read the wrong bytes. The one allowed change is
 * appending a field at the end of a params/info/result struct that starts
 * with `struct_size` (the library reads only the bytes struct_size covers):
 * then the struct's size grows and the new field is added here, while every
 * existing line stays as it is. Enum values are never renumbered; new values
 * are appended.
 */
#include <setjmp.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* The experimental section too: it may change in a minor release, but only
 * on purpose, so its layout is pinned here like the rest. */
#define LLM_EXPERIMENTAL
#include "llm.h"

#if defined(__x86_64__) && defined(__LP64__)
#define LAYOUT_PINNED 1
#else
#define LAYOUT_PINNED 0
#endif

/* Number of mismatches seen by the current test; each is printed. */
static int mismatches;

static void check_num(const char *what, unsigned long long got, unsigned long long want) {
    if (got != want) {
        print_error("ABI mismatch: %s is %llu, pinned at %llu\n", what, got, want);
        mismatches++;
    }
}

static void check_true(const char *what, int ok) {
    if (!ok) {
        print_error("ABI mismatch: %s\n", what);
        mismatches++;
    }
}

/* The pinned numbers, and the library's own answer by name
 * (llm_struct_size, llm_struct_offset: what bindings check at load). */
#define STRUCT(T, size, align)                                                                     \
    check_num("sizeof(" #T ")", sizeof(T), (size));                                                \
    check_num("llm_struct_size(\"" #T "\")", llm_struct_size(#T), sizeof(T));                      \
    check_num("alignof(" #T ")", alignof(T), (align))

/* Offset, size and exact type (through _Generic) of one field. */
#define FIELD(T, m, off, size, type)                                                               \
    check_num("offsetof(" #T ", " #m ")", offsetof(T, m), (off));                                  \
    check_num("llm_struct_offset(" #T ", " #m ")", llm_struct_offset(#T, #m), offsetof(T, m));     \
    check_num("sizeof(" #T "." #m ")", sizeof(((T *)0)->m), (size));                               \
    check_true(#T "." #m " is not of type " #type, _Generic(((T *)0)->m, type : 1, default : 0))

#define BEGIN_LAYOUT()                                                                             \
    do {                                                                                           \
        if (!LAYOUT_PINNED)                                                                        \
            skip();                                                                                \
        mismatches = 0;                                                                            \
    } while (0)

#define END_CHECKS() assert_int_equal(mismatches, 0)

static void test_model_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_model_params, 40, 8);
    FIELD(llm_model_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_model_params, use_mmap, 4, 1, bool);
    FIELD(llm_model_params, error_message, 8, 8, char *); /* 1.2 */
    FIELD(llm_model_params, error_capacity, 16, 8, size_t);
    FIELD(llm_model_params, progress, 24, 8, llm_progress_fn); /* 1.3 */
    FIELD(llm_model_params, progress_user, 32, 8, void *);
    END_CHECKS();
}

static void test_model_info_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_model_info, 88, 8);
    FIELD(llm_model_info, struct_size, 0, 4, uint32_t);
    FIELD(llm_model_info, architecture, 8, 8, const char *);
    FIELD(llm_model_info, name, 16, 8, const char *);
    FIELD(llm_model_info, n_params, 24, 8, uint64_t);
    FIELD(llm_model_info, weight_bytes, 32, 8, uint64_t);
    FIELD(llm_model_info, n_layers, 40, 4, uint32_t);
    FIELD(llm_model_info, n_embd, 44, 4, uint32_t);
    FIELD(llm_model_info, n_heads, 48, 4, uint32_t);
    FIELD(llm_model_info, n_kv_heads, 52, 4, uint32_t);
    FIELD(llm_model_info, n_ff, 56, 4, uint32_t);
    FIELD(llm_model_info, n_vocab, 60, 4, uint32_t);
    FIELD(llm_model_info, n_ctx_train, 64, 4, uint32_t);
    FIELD(llm_model_info, bos, 68, 4, llm_token);
    FIELD(llm_model_info, eos, 72, 4, llm_token);
    FIELD(llm_model_info, eot, 76, 4, llm_token);
    FIELD(llm_model_info, pad, 80, 4, llm_token);
    FIELD(llm_model_info, has_chat_template, 84, 1, bool);
    END_CHECKS();
}

static void test_session_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_session_params, 80, 8);
    FIELD(llm_session_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_session_params, n_threads, 4, 4, uint32_t);
    FIELD(llm_session_params, n_ctx, 8, 4, uint32_t);
    FIELD(llm_session_params, max_batch_tokens, 12, 4, uint32_t);
    FIELD(llm_session_params, kv_cache_bytes, 16, 8, uint64_t);
    FIELD(llm_session_params, kv_type, 24, 4, llm_kv_type);
    FIELD(llm_session_params, kv_block_size, 28, 4, uint32_t);
    FIELD(llm_session_params, prefix_cache, 32, 1, bool);
    FIELD(llm_session_params, draft_model, 40, 8, const llm_model *);
    FIELD(llm_session_params, error_message, 48, 8, char *); /* 1.2 */
    FIELD(llm_session_params, error_capacity, 56, 8, size_t);
    FIELD(llm_session_params, progress, 64, 8, llm_progress_fn); /* 1.3 */
    FIELD(llm_session_params, progress_user, 72, 8, void *);
    END_CHECKS();
}

/* Experimental (LLM_EXPERIMENTAL). */
static void test_backend_info_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_backend_info, 280, 8);
    FIELD(llm_backend_info, struct_size, 0, 4, uint32_t);
    FIELD(llm_backend_info, name, 8, 8, const char *);
    FIELD(llm_backend_info, available, 16, 1, bool);
    FIELD(llm_backend_info, n_devices, 20, 4, uint32_t);
    FIELD(llm_backend_info, reason, 24, 256, char *);
    END_CHECKS();
}

/* Experimental (LLM_EXPERIMENTAL). */
static void test_device_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_device_params, 32, 8);
    FIELD(llm_device_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_device_params, backend, 8, 8, const char *);
    FIELD(llm_device_params, devices, 16, 8, const int32_t *);
    FIELD(llm_device_params, n_devices, 24, 4, uint32_t);
    FIELD(llm_device_params, tensor_parallel, 28, 4, uint32_t);
    END_CHECKS();
}

/* Since 1.3. */
static void test_embed_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_embed_params, 12, 4);
    FIELD(llm_embed_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_embed_params, pooling, 4, 4, llm_pooling);
    FIELD(llm_embed_params, normalize, 8, 1, bool);
    END_CHECKS();
}

static void test_request_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_request_params, 96, 8);
    FIELD(llm_request_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_request_params, sampling, 8, 8, const llm_sampling_params *);
    FIELD(llm_request_params, max_new_tokens, 16, 4, uint32_t);
    FIELD(llm_request_params, priority, 20, 4, int32_t);
    FIELD(llm_request_params, ignore_eos, 24, 1, bool);
    FIELD(llm_request_params, logprobs, 25, 1, bool);
    FIELD(llm_request_params, stop_tokens, 32, 8, const llm_token *);
    FIELD(llm_request_params, n_stop_tokens, 40, 8, size_t);
    FIELD(llm_request_params, stop_strings, 48, 8, const char *const *);
    FIELD(llm_request_params, n_stop_strings, 56, 8, size_t);
    FIELD(llm_request_params, top_logprobs, 64, 4, uint32_t);
    FIELD(llm_request_params, spec_mode, 68, 4, uint32_t);
    FIELD(llm_request_params, spec_k, 72, 4, uint32_t);
    FIELD(llm_request_params, n_samples, 76, 4, uint32_t);
    FIELD(llm_request_params, adapter, 80, 8, const llm_adapter *); /* since 1.4 */
    FIELD(llm_request_params, adapter_scale, 88, 4, float);         /* since 1.4 */
    END_CHECKS();
}

static void test_event_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_event, 72, 8);
    FIELD(llm_event, request, 0, 8, llm_request_id);
    FIELD(llm_event, token, 8, 4, llm_token);
    FIELD(llm_event, text, 16, 8, const char *);
    FIELD(llm_event, text_len, 24, 8, size_t);
    FIELD(llm_event, logprob, 32, 4, float);
    FIELD(llm_event, finish_reason, 36, 4, llm_finish_reason);
    FIELD(llm_event, status, 40, 4, llm_status);
    FIELD(llm_event, top_tokens, 48, 8, const llm_token *);
    FIELD(llm_event, top_logprobs, 56, 8, const float *);
    FIELD(llm_event, n_top, 64, 4, uint32_t);
    FIELD(llm_event, sample_index, 68, 4, uint32_t);
    END_CHECKS();
}

static void test_session_stats_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_session_stats, 104, 8);
    FIELD(llm_session_stats, struct_size, 0, 4, uint32_t);
    FIELD(llm_session_stats, n_running, 4, 4, uint32_t);
    FIELD(llm_session_stats, n_waiting, 8, 4, uint32_t);
    FIELD(llm_session_stats, block_size, 12, 4, uint32_t);
    FIELD(llm_session_stats, blocks_total, 16, 4, uint32_t);
    FIELD(llm_session_stats, blocks_used, 20, 4, uint32_t);
    FIELD(llm_session_stats, blocks_cached, 24, 4, uint32_t);
    FIELD(llm_session_stats, blocks_free, 28, 4, uint32_t);
    FIELD(llm_session_stats, kv_tokens_used, 32, 8, uint64_t);
    FIELD(llm_session_stats, prefix_hit_tokens, 40, 8, uint64_t);
    FIELD(llm_session_stats, prompt_tokens, 48, 8, uint64_t);
    FIELD(llm_session_stats, generated_tokens, 56, 8, uint64_t);
    FIELD(llm_session_stats, preemptions, 64, 8, uint64_t);
    FIELD(llm_session_stats, steps, 72, 8, uint64_t);
    FIELD(llm_session_stats, spec_steps, 80, 8, uint64_t);
    FIELD(llm_session_stats, spec_draft_tokens, 88, 8, uint64_t);
    FIELD(llm_session_stats, spec_accepted_tokens, 96, 8, uint64_t);
    END_CHECKS();
}

static void test_sampling_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_sampling_params, 80, 8);
    FIELD(llm_sampling_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_sampling_params, temperature, 4, 4, float);
    FIELD(llm_sampling_params, top_k, 8, 4, int32_t);
    FIELD(llm_sampling_params, top_p, 12, 4, float);
    FIELD(llm_sampling_params, min_p, 16, 4, float);
    FIELD(llm_sampling_params, seed, 24, 8, uint64_t);
    FIELD(llm_sampling_params, repeat_penalty, 32, 4, float);
    FIELD(llm_sampling_params, repeat_last_n, 36, 4, int32_t);
    FIELD(llm_sampling_params, presence_penalty, 40, 4, float);
    FIELD(llm_sampling_params, frequency_penalty, 44, 4, float);
    FIELD(llm_sampling_params, logit_bias, 48, 8, const llm_logit_bias *);
    FIELD(llm_sampling_params, n_logit_bias, 56, 8, size_t);
    FIELD(llm_sampling_params, min_tokens, 64, 4, uint32_t);
    FIELD(llm_sampling_params, grammar, 72, 8, const llm_grammar *); /* since 1.3 */
    END_CHECKS();
}

static void test_grammar_params_layout(void **state) { /* since 1.3 */
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_grammar_params, 16, 8);
    FIELD(llm_grammar_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_grammar_params, whitespace, 4, 4, uint32_t);
    FIELD(llm_grammar_params, root, 8, 8, const char *);
    END_CHECKS();
}

static void test_adapter_params_layout(void **state) { /* since 1.4 */
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_adapter_params, 8, 4);
    FIELD(llm_adapter_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_adapter_params, use_mmap, 4, 1, bool);
    END_CHECKS();
}

static void test_logit_bias_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_logit_bias, 8, 4);
    FIELD(llm_logit_bias, token, 0, 4, llm_token);
    FIELD(llm_logit_bias, bias, 4, 4, float);
    END_CHECKS();
}

static void test_generate_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_generate_params, 64, 8);
    FIELD(llm_generate_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_generate_params, max_new_tokens, 4, 4, uint32_t);
    FIELD(llm_generate_params, sampling, 8, 8, const llm_sampling_params *);
    FIELD(llm_generate_params, on_token, 16, 8, llm_token_fn);
    FIELD(llm_generate_params, user, 24, 8, void *);
    FIELD(llm_generate_params, ignore_eos, 32, 1, bool);
    FIELD(llm_generate_params, spec_mode, 36, 4, uint32_t);
    FIELD(llm_generate_params, spec_k, 40, 4, uint32_t);
    FIELD(llm_generate_params, adapter, 48, 8, const llm_adapter *); /* since 1.4 */
    FIELD(llm_generate_params, adapter_scale, 56, 4, float);         /* since 1.4 */
    END_CHECKS();
}

static void test_generate_result_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_generate_result, 48, 8);
    FIELD(llm_generate_result, struct_size, 0, 4, uint32_t);
    FIELD(llm_generate_result, finish_reason, 4, 4, llm_finish_reason);
    FIELD(llm_generate_result, n_prompt_tokens, 8, 4, uint32_t);
    FIELD(llm_generate_result, n_generated_tokens, 12, 4, uint32_t);
    FIELD(llm_generate_result, prompt_seconds, 16, 8, double);
    FIELD(llm_generate_result, generate_seconds, 24, 8, double);
    FIELD(llm_generate_result, n_spec_steps, 32, 4, uint32_t);
    FIELD(llm_generate_result, n_draft_tokens, 36, 4, uint32_t);
    FIELD(llm_generate_result, n_accepted_tokens, 40, 4, uint32_t);
    END_CHECKS();
}

static void test_chat_message_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_chat_message, 16, 8);
    FIELD(llm_chat_message, role, 0, 8, const char *);
    FIELD(llm_chat_message, content, 8, 8, const char *);
    END_CHECKS();
}

static void test_chat_params_layout(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    STRUCT(llm_chat_params, 64, 8);
    FIELD(llm_chat_params, struct_size, 0, 4, uint32_t);
    FIELD(llm_chat_params, messages_json, 8, 8, const char *);
    FIELD(llm_chat_params, tools_json, 16, 8, const char *);
    FIELD(llm_chat_params, documents_json, 24, 8, const char *);
    FIELD(llm_chat_params, variables_json, 32, 8, const char *);
    FIELD(llm_chat_params, template_text, 40, 8, const char *);
    FIELD(llm_chat_params, template_name, 48, 8, const char *);
    FIELD(llm_chat_params, add_generation_prompt, 56, 1, bool);
    FIELD(llm_chat_params, continue_final_message, 57, 1, bool);
    END_CHECKS();
}

/* Callback and scalar types that appear in signatures. */
static void test_scalar_types(void **state) {
    (void)state;
    BEGIN_LAYOUT();
    check_num("sizeof(llm_token)", sizeof(llm_token), 4);
    check_true("llm_token is not int32_t", _Generic((llm_token)0, int32_t : 1, default : 0));
    check_num("LLM_TOKEN_NONE", (unsigned long long)(long long)LLM_TOKEN_NONE,
              (unsigned long long)-1LL);
    check_true("LLM_TOKEN_NONE is not an enumerator of llm_token_constant",
               _Generic((llm_token_constant)LLM_TOKEN_NONE, llm_token_constant : 1, default : 0));
    check_num("sizeof(llm_status)", sizeof(llm_status), 4);
    check_num("sizeof(llm_log_level)", sizeof(llm_log_level), 4);
    check_num("sizeof(llm_kv_type)", sizeof(llm_kv_type), 4);
    check_num("sizeof(llm_finish_reason)", sizeof(llm_finish_reason), 4);
    check_num("sizeof(llm_spec_mode)", sizeof(llm_spec_mode), 4);
    check_true(
        "llm_log_fn changed type",
        _Generic((llm_log_fn)0, void (*)(llm_log_level, const char *, void *) : 1, default : 0));
    check_true("llm_token_fn changed type",
               _Generic((llm_token_fn)0, bool (*)(llm_token, const char *, size_t, void *) : 1,
                        default : 0));
    END_CHECKS();
}

static void test_status_values(void **state) {
    (void)state;
    mismatches = 0;
    check_num("LLM_OK", LLM_OK, 0);
    check_num("LLM_ERR_INVALID_ARGUMENT", LLM_ERR_INVALID_ARGUMENT, 1);
    check_num("LLM_ERR_OUT_OF_MEMORY", LLM_ERR_OUT_OF_MEMORY, 2);
    check_num("LLM_ERR_IO", LLM_ERR_IO, 3);
    check_num("LLM_ERR_BAD_FORMAT", LLM_ERR_BAD_FORMAT, 4);
    check_num("LLM_ERR_UNSUPPORTED", LLM_ERR_UNSUPPORTED, 5);
    check_num("LLM_ERR_BUFFER_TOO_SMALL", LLM_ERR_BUFFER_TOO_SMALL, 6);
    check_num("LLM_ERR_LIMIT", LLM_ERR_LIMIT, 7);
    check_num("LLM_ERR_INVALID_UTF8", LLM_ERR_INVALID_UTF8, 8);
    check_num("LLM_ERR_NOT_FOUND", LLM_ERR_NOT_FOUND, 9);
    check_num("LLM_ERR_CANCELLED", LLM_ERR_CANCELLED, 10);
    check_num("LLM_ERR_BACKEND", LLM_ERR_BACKEND, 11);
    check_num("LLM_ERR_INTERNAL", LLM_ERR_INTERNAL, 12);

    /* LLM_STATUS_LIST may only grow at the end: its first 13 entries are the
     * ones above, in order, and every entry's name and text are what the
     * library reports for it. */
    static const struct {
        int value;
        const char *name, *text;
    } list[] = {
#define LLM_STATUS_ROW_(name, value, text) {value, #name, text},
        LLM_STATUS_LIST(LLM_STATUS_ROW_)
#undef LLM_STATUS_ROW_
    };
    size_t n = sizeof list / sizeof list[0];
    check_true("LLM_STATUS_LIST has fewer than 13 entries", n >= 13);
    for (size_t i = 0; i < n; i++) {
        char what[128];
        snprintf(what, sizeof what, "value of LLM_STATUS_LIST entry %zu (%s)", i, list[i].name);
        check_num(what, (unsigned long long)list[i].value, i);
        snprintf(what, sizeof what, "llm_status_name(%d) is \"%s\", expected \"%s\"", list[i].value,
                 llm_status_name((llm_status)list[i].value), list[i].name);
        check_true(what, strcmp(llm_status_name((llm_status)list[i].value), list[i].name) == 0);
        snprintf(what, sizeof what, "llm_status_str(%d) is \"%s\", expected \"%s\"", list[i].value,
                 llm_status_str((llm_status)list[i].value), list[i].text);
        check_true(what, strcmp(llm_status_str((llm_status)list[i].value), list[i].text) == 0);
    }
    END_CHECKS();
}

static void test_enum_values(void **state) {
    (void)state;
    mismatches = 0;
    check_num("LLM_LOG_DEBUG", LLM_LOG_DEBUG, 0);
    check_num("LLM_LOG_INFO", LLM_LOG_INFO, 1);
    check_num("LLM_LOG_WARN", LLM_LOG_WARN, 2);
    check_num("LLM_LOG_ERROR", LLM_LOG_ERROR, 3);

    check_num("LLM_PROGRESS_READ", LLM_PROGRESS_READ, 0); /* 1.3 */
    check_num("LLM_PROGRESS_UPLOAD", LLM_PROGRESS_UPLOAD, 1);
    check_num("LLM_PROGRESS_WARMUP", LLM_PROGRESS_WARMUP, 2);
    check_num("LLM_GRAMMAR_WS_COMPACT", LLM_GRAMMAR_WS_COMPACT, 0);
    check_num("LLM_GRAMMAR_WS_FLEXIBLE", LLM_GRAMMAR_WS_FLEXIBLE, 1);

    check_num("LLM_KV_F32", LLM_KV_F32, 0);
    check_num("LLM_KV_F16", LLM_KV_F16, 1);
    check_num("LLM_KV_BF16", LLM_KV_BF16, 2);
    check_num("LLM_KV_Q8_0", LLM_KV_Q8_0, 3);
    check_num("LLM_KV_Q4_0", LLM_KV_Q4_0, 4);
    check_num("LLM_KV_FP8_E4M3", LLM_KV_FP8_E4M3, 5);

    check_num("LLM_FINISH_NONE", LLM_FINISH_NONE, 0);
    check_num("LLM_FINISH_EOS", LLM_FINISH_EOS, 1);
    check_num("LLM_FINISH_LENGTH", LLM_FINISH_LENGTH, 2);
    check_num("LLM_FINISH_STOP", LLM_FINISH_STOP, 3);
    check_num("LLM_FINISH_CANCELLED", LLM_FINISH_CANCELLED, 4);
    check_num("LLM_FINISH_ERROR", LLM_FINISH_ERROR, 5);

    check_num("LLM_SPEC_NONE", LLM_SPEC_NONE, 0);
    check_num("LLM_SPEC_NGRAM", LLM_SPEC_NGRAM, 1);
    check_num("LLM_SPEC_DRAFT", LLM_SPEC_DRAFT, 2);
    check_num("LLM_SPEC_MAX_K", LLM_SPEC_MAX_K, 32);

    check_num("LLM_TOKENIZE_ADD_SPECIAL", LLM_TOKENIZE_ADD_SPECIAL, 1);
    check_num("LLM_TOKENIZE_PARSE_SPECIAL", LLM_TOKENIZE_PARSE_SPECIAL, 2);
    check_num("LLM_TOKENIZE_STRICT", LLM_TOKENIZE_STRICT, 4);
    check_num("LLM_DETOKENIZE_SPECIAL", LLM_DETOKENIZE_SPECIAL, 1);
    check_num("LLM_POOLING_MODEL", LLM_POOLING_MODEL, 0);
    check_num("LLM_POOLING_NONE", LLM_POOLING_NONE, 1);
    check_num("LLM_POOLING_MEAN", LLM_POOLING_MEAN, 2);
    check_num("LLM_POOLING_FIRST", LLM_POOLING_FIRST, 3);
    check_num("LLM_POOLING_LAST", LLM_POOLING_LAST, 4);
    END_CHECKS();
}

static void test_version(void **state) {
    (void)state;
    mismatches = 0;
    /* The major version is the SONAME's: libllminfer.so.1. */
    check_num("LLM_VERSION_MAJOR", LLM_VERSION_MAJOR, 1);
    check_num("LLM_VERSION_NUMBER", LLM_VERSION_NUMBER,
              LLM_VERSION_MAJOR * 10000 + LLM_VERSION_MINOR * 100 + LLM_VERSION_PATCH);
    check_num("llm_version_number()", llm_version_number(), LLM_VERSION_NUMBER);

    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LLM_VERSION_MAJOR, LLM_VERSION_MINOR,
             LLM_VERSION_PATCH);
    const char *got = llm_version_string();
    assert_non_null(got);
    char what[96];
    snprintf(what, sizeof what, "llm_version_string() is \"%s\", expected \"%s\"", got, want);
    check_true(what, strcmp(got, want) == 0);
    END_CHECKS();
}

/*
 * Each *_params_init() sets struct_size to the struct's size and writes no
 * byte past it (a caller built against this header allocates exactly that).
 */
#define CHECK_INIT(T, init_fn)                                                                     \
    do {                                                                                           \
        union {                                                                                    \
            T params;                                                                              \
            unsigned char bytes[sizeof(T) + 32];                                                   \
        } buf;                                                                                     \
        memset(&buf, 0xA5, sizeof buf);                                                            \
        init_fn(&buf.params);                                                                      \
        check_num(#init_fn "(): struct_size", buf.params.struct_size, sizeof(T));                  \
        int clean = 1;                                                                             \
        for (size_t i = sizeof(T); i < sizeof buf.bytes; i++)                                      \
            clean &= buf.bytes[i] == 0xA5;                                                         \
        check_true(#init_fn "() wrote past sizeof(" #T ")", clean);                                \
    } while (0)

/* Names the library does not know. */
static void test_struct_query_unknown(void **state) {
    (void)state;
    assert_int_equal(llm_struct_size("llm_no_such_struct"), 0);
    assert_int_equal(llm_struct_size(NULL), 0);
    assert_true(llm_struct_offset("llm_session_params", "no_such_field") == SIZE_MAX);
    assert_true(llm_struct_offset("llm_no_such_struct", "struct_size") == SIZE_MAX);
    assert_true(llm_struct_offset(NULL, "x") == SIZE_MAX);
    assert_true(llm_struct_offset("llm_event", NULL) == SIZE_MAX);
}

static void test_params_init_struct_size(void **state) {
    (void)state;
    mismatches = 0;
    CHECK_INIT(llm_model_params, llm_model_params_init);
    CHECK_INIT(llm_session_params, llm_session_params_init);
    CHECK_INIT(llm_sampling_params, llm_sampling_params_init);
    CHECK_INIT(llm_generate_params, llm_generate_params_init);
    CHECK_INIT(llm_request_params, llm_request_params_init);
    CHECK_INIT(llm_device_params, llm_device_params_init);
    CHECK_INIT(llm_embed_params, llm_embed_params_init);
    END_CHECKS();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_params_layout),
        cmocka_unit_test(test_model_info_layout),
        cmocka_unit_test(test_session_params_layout),
        cmocka_unit_test(test_backend_info_layout),
        cmocka_unit_test(test_device_params_layout),
        cmocka_unit_test(test_grammar_params_layout),
        cmocka_unit_test(test_adapter_params_layout),
        cmocka_unit_test(test_request_params_layout),
        cmocka_unit_test(test_embed_params_layout),
        cmocka_unit_test(test_event_layout),
        cmocka_unit_test(test_session_stats_layout),
        cmocka_unit_test(test_sampling_params_layout),
        cmocka_unit_test(test_logit_bias_layout),
        cmocka_unit_test(test_generate_params_layout),
        cmocka_unit_test(test_generate_result_layout),
        cmocka_unit_test(test_chat_message_layout),
        cmocka_unit_test(test_chat_params_layout),
        cmocka_unit_test(test_scalar_types),
        cmocka_unit_test(test_status_values),
        cmocka_unit_test(test_enum_values),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_params_init_struct_size),
        cmocka_unit_test(test_struct_query_unknown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
