/* llm_struct_size and llm_struct_offset: the layout of every public struct,
 * by name, as this library was compiled, for bindings that check theirs at
 * load time. tests/api/test_abi_layout.c checks that every pinned field is
 * listed here. */
#define LLM_EXPERIMENTAL
#include "core/core.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct struct_size_entry {
    const char *name;
    size_t size;
} struct_size_entry;

typedef struct field_entry {
    const char *type, *field;
    size_t offset;
} field_entry;

#define S(T) {#T, sizeof(T)}
static const struct_size_entry sizes[] = {
    S(llm_model_params),
    S(llm_model_info),
    S(llm_chat_message),
    S(llm_chat_params),
    S(llm_session_params),
    S(llm_logit_bias),
    S(llm_sampling_params),
    S(llm_generate_params),
    S(llm_generate_result),
    S(llm_request_params),
    S(llm_event),
    S(llm_session_stats),
    S(llm_backend_info),
    S(llm_device_params),
    S(llm_embed_params),
    S(llm_grammar_params),
    S(llm_adapter_params),
};
#undef S

#define F(T, f) {#T, #f, offsetof(T, f)}
static const field_entry fields[] = {
    F(llm_model_params, struct_size),
    F(llm_model_params, use_mmap),
    F(llm_model_params, error_message),
    F(llm_model_params, error_capacity),
    F(llm_model_params, progress),
    F(llm_model_params, progress_user),
    F(llm_model_info, struct_size),
    F(llm_model_info, architecture),
    F(llm_model_info, name),
    F(llm_model_info, n_params),
    F(llm_model_info, weight_bytes),
    F(llm_model_info, n_layers),
    F(llm_model_info, n_embd),
    F(llm_model_info, n_heads),
    F(llm_model_info, n_kv_heads),
    F(llm_model_info, n_ff),
    F(llm_model_info, n_vocab),
    F(llm_model_info, n_ctx_train),
    F(llm_model_info, bos),
    F(llm_model_info, eos),
    F(llm_model_info, eot),
    F(llm_model_info, pad),
    F(llm_model_info, has_chat_template),
    F(llm_chat_message, role),
    F(llm_chat_message, content),
    F(llm_chat_params, struct_size),
    F(llm_chat_params, messages_json),
    F(llm_chat_params, tools_json),
    F(llm_chat_params, documents_json),
    F(llm_chat_params, variables_json),
    F(llm_chat_params, template_text),
    F(llm_chat_params, template_name),
    F(llm_chat_params, add_generation_prompt),
    F(llm_chat_params, continue_final_message),
    F(llm_session_params, struct_size),
    F(llm_session_params, n_threads),
    F(llm_session_params, n_ctx),
    F(llm_session_params, max_batch_tokens),
    F(llm_session_params, kv_cache_bytes),
    F(llm_session_params, kv_type),
    F(llm_session_params, kv_block_size),
    F(llm_session_params, prefix_cache),
    F(llm_session_params, draft_model),
    F(llm_session_params, error_message),
    F(llm_session_params, error_capacity),
    F(llm_session_params, progress),
    F(llm_session_params, progress_user),
    F(llm_logit_bias, token),
    F(llm_logit_bias, bias),
    F(llm_sampling_params, struct_size),
    F(llm_sampling_params, temperature),
    F(llm_sampling_params, top_k),
    F(llm_sampling_params, top_p),
    F(llm_sampling_params, min_p),
    F(llm_sampling_params, seed),
    F(llm_sampling_params, repeat_penalty),
    F(llm_sampling_params, repeat_last_n),
    F(llm_sampling_params, presence_penalty),
    F(llm_sampling_params, frequency_penalty),
    F(llm_sampling_params, logit_bias),
    F(llm_sampling_params, n_logit_bias),
    F(llm_sampling_params, min_tokens),
    F(llm_sampling_params, grammar),
    F(llm_generate_params, struct_size),
    F(llm_generate_params, max_new_tokens),
    F(llm_generate_params, sampling),
    F(llm_generate_params, on_token),
    F(llm_generate_params, user),
    F(llm_generate_params, ignore_eos),
    F(llm_generate_params, spec_mode),
    F(llm_generate_params, spec_k),
    F(llm_generate_params, adapter),
    F(llm_generate_params, adapter_scale),
    F(llm_generate_result, struct_size),
    F(llm_generate_result, finish_reason),
    F(llm_generate_result, n_prompt_tokens),
    F(llm_generate_result, n_generated_tokens),
    F(llm_generate_result, prompt_seconds),
    F(llm_generate_result, generate_seconds),
    F(llm_generate_result, n_spec_steps),
    F(llm_generate_result, n_draft_tokens),
    F(llm_generate_result, n_accepted_tokens),
    F(llm_request_params, struct_size),
    F(llm_request_params, sampling),
    F(llm_request_params, max_new_tokens),
    F(llm_request_params, priority),
    F(llm_request_params, ignore_eos),
    F(llm_request_params, logprobs),
    F(llm_request_params, stop_tokens),
    F(llm_request_params, n_stop_tokens),
    F(llm_request_params, stop_strings),
    F(llm_request_params, n_stop_strings),
    F(llm_request_params, top_logprobs),
    F(llm_request_params, spec_mode),
    F(llm_request_params, spec_k),
    F(llm_request_params, n_samples),
    F(llm_request_params, adapter),
    F(llm_request_params, adapter_scale),
    F(llm_event, request),
    F(llm_event, token),
    F(llm_event, text),
    F(llm_event, text_len),
    F(llm_event, logprob),
    F(llm_event, finish_reason),
    F(llm_event, status),
    F(llm_event, top_tokens),
    F(llm_event, top_logprobs),
    F(llm_event, n_top),
    F(llm_event, sample_index),
    F(llm_session_stats, struct_size),
    F(llm_session_stats, n_running),
    F(llm_session_stats, n_waiting),
    F(llm_session_stats, block_size),
    F(llm_session_stats, blocks_total),
    F(llm_session_stats, blocks_used),
    F(llm_session_stats, blocks_cached),
    F(llm_session_stats, blocks_free),
    F(llm_session_stats, kv_tokens_used),
    F(llm_session_stats, prefix_hit_tokens),
    F(llm_session_stats, prompt_tokens),
    F(llm_session_stats, generated_tokens),
    F(llm_session_stats, preemptions),
    F(llm_session_stats, steps),
    F(llm_session_stats, spec_steps),
    F(llm_session_stats, spec_draft_tokens),
    F(llm_session_stats, spec_accepted_tokens),
    F(llm_backend_info, struct_size),
    F(llm_backend_info, name),
    F(llm_backend_info, available),
    F(llm_backend_info, n_devices),
    F(llm_backend_info, reason),
    F(llm_device_params, struct_size),
    F(llm_device_params, backend),
    F(llm_device_params, devices),
    F(llm_device_params, n_devices),
    F(llm_device_params, tensor_parallel),
    F(llm_embed_params, struct_size),
    F(llm_embed_params, pooling),
    F(llm_embed_params, normalize),
    F(llm_grammar_params, struct_size),
    F(llm_grammar_params, whitespace),
    F(llm_grammar_params, root),
    F(llm_adapter_params, struct_size),
    F(llm_adapter_params, use_mmap),
};
#undef F

LLM_API size_t llm_struct_size(const char *name) {
    if (!name) return 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(sizes[i].name, name) == 0) return sizes[i].size;
    return 0;
}

LLM_API size_t llm_struct_offset(const char *struct_name, const char *field) {
    if (!struct_name || !field) return SIZE_MAX;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].type, struct_name) == 0 && strcmp(fields[i].field, field) == 0)
            return fields[i].offset;
    return SIZE_MAX;
}
