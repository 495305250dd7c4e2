//! Raw declarations of libllminfer's C API, `llm.h` 1.2, written by hand.
//!
//! Every item mirrors the header one to one; the header's comments are the
//! contract and are not repeated here. C enums are `c_int`/`u32` aliases with
//! constants, because a C enum may legally carry values Rust enums cannot.
//! [`struct_layouts`] lists every struct's size and field offsets as this
//! crate declares them, so a program (or the tests) can compare them with
//! `llm_struct_size` / `llm_struct_offset` of the loaded library.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_uint, c_void};

pub const LLM_VERSION_MAJOR: c_uint = 1;
pub const LLM_VERSION_MINOR: c_uint = 4;
pub const LLM_VERSION_PATCH: c_uint = 0;
pub const LLM_VERSION_NUMBER: c_uint =
    LLM_VERSION_MAJOR * 10000 + LLM_VERSION_MINOR * 100 + LLM_VERSION_PATCH;

pub type llm_status = c_int;
pub const LLM_OK: llm_status = 0;
pub const LLM_ERR_INVALID_ARGUMENT: llm_status = 1;
pub const LLM_ERR_OUT_OF_MEMORY: llm_status = 2;
pub const LLM_ERR_IO: llm_status = 3;
pub const LLM_ERR_BAD_FORMAT: llm_status = 4;
pub const LLM_ERR_UNSUPPORTED: llm_status = 5;
pub const LLM_ERR_BUFFER_TOO_SMALL: llm_status = 6;
pub const LLM_ERR_LIMIT: llm_status = 7;
pub const LLM_ERR_INVALID_UTF8: llm_status = 8;
pub const LLM_ERR_NOT_FOUND: llm_status = 9;
pub const LLM_ERR_CANCELLED: llm_status = 10;
pub const LLM_ERR_BACKEND: llm_status = 11;
pub const LLM_ERR_INTERNAL: llm_status = 12;

pub type llm_log_level = c_int;
pub const LLM_LOG_DEBUG: llm_log_level = 0;
pub const LLM_LOG_INFO: llm_log_level = 1;
pub const LLM_LOG_WARN: llm_log_level = 2;
pub const LLM_LOG_ERROR: llm_log_level = 3;

pub type llm_log_fn =
    Option<unsafe extern "C" fn(level: llm_log_level, message: *const c_char, user: *mut c_void)>;

pub type llm_token = i32;
pub const LLM_TOKEN_NONE: llm_token = -1;

#[repr(C)]
pub struct llm_model {
    _opaque: [u8; 0],
}

/// A compiled grammar (llm.h's grammar API, since 1.3).
#[repr(C)]
pub struct llm_grammar {
    _opaque: [u8; 0],
}

/// A LoRA adapter (llm.h's adapter API, since 1.4; docs/lora.md).
#[repr(C)]
pub struct llm_adapter {
    _opaque: [u8; 0],
}

/// Options of `llm_adapter_load` (since 1.4).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_adapter_params {
    pub struct_size: u32,
    pub use_mmap: bool,
}

pub type llm_grammar_whitespace = c_uint;
pub const LLM_GRAMMAR_WS_COMPACT: llm_grammar_whitespace = 0;
pub const LLM_GRAMMAR_WS_FLEXIBLE: llm_grammar_whitespace = 1;

/// Options of the grammar compilers (since 1.3).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_grammar_params {
    pub struct_size: u32,
    pub whitespace: u32,
    pub root: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_model_params {
    pub struct_size: u32,
    pub use_mmap: bool,
    pub error_message: *mut c_char,
    pub error_capacity: usize,
    /// Since 1.3.
    pub progress: llm_progress_fn,
    pub progress_user: *mut c_void,
}

pub type llm_progress_phase = c_uint;
pub const LLM_PROGRESS_READ: llm_progress_phase = 0;
pub const LLM_PROGRESS_UPLOAD: llm_progress_phase = 1;
pub const LLM_PROGRESS_WARMUP: llm_progress_phase = 2;
/// `llm_progress_fn` (since 1.3): false cancels the load.
pub type llm_progress_fn =
    Option<unsafe extern "C" fn(llm_progress_phase, u64, u64, *mut c_void) -> bool>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_model_info {
    pub struct_size: u32,
    pub architecture: *const c_char,
    pub name: *const c_char,
    pub n_params: u64,
    pub weight_bytes: u64,
    pub n_layers: u32,
    pub n_embd: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub n_ff: u32,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub bos: llm_token,
    pub eos: llm_token,
    pub eot: llm_token,
    pub pad: llm_token,
    pub has_chat_template: bool,
}

pub type llm_tokenize_flag = c_uint;
pub const LLM_TOKENIZE_ADD_SPECIAL: llm_tokenize_flag = 1 << 0;
pub const LLM_TOKENIZE_PARSE_SPECIAL: llm_tokenize_flag = 1 << 1;
pub const LLM_TOKENIZE_STRICT: llm_tokenize_flag = 1 << 2;

pub type llm_detokenize_flag = c_uint;
pub const LLM_DETOKENIZE_SPECIAL: llm_detokenize_flag = 1 << 0;

#[repr(C)]
pub struct llm_detokenizer {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
}

#[repr(C)]
pub struct llm_session {
    _opaque: [u8; 0],
}

pub type llm_kv_type = c_uint;
pub const LLM_KV_F32: llm_kv_type = 0;
pub const LLM_KV_F16: llm_kv_type = 1;
pub const LLM_KV_BF16: llm_kv_type = 2;
pub const LLM_KV_Q8_0: llm_kv_type = 3;
pub const LLM_KV_Q4_0: llm_kv_type = 4;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_session_params {
    pub struct_size: u32,
    pub n_threads: u32,
    pub n_ctx: u32,
    pub max_batch_tokens: u32,
    pub kv_cache_bytes: u64,
    pub kv_type: llm_kv_type,
    pub kv_block_size: u32,
    pub prefix_cache: bool,
    pub draft_model: *const llm_model,
    pub error_message: *mut c_char,
    pub error_capacity: usize,
    /// Since 1.3.
    pub progress: llm_progress_fn,
    pub progress_user: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_logit_bias {
    pub token: llm_token,
    pub bias: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_sampling_params {
    pub struct_size: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: *const llm_logit_bias,
    pub n_logit_bias: usize,
    pub min_tokens: u32,
    /// Since 1.3: a compiled grammar the tokens must follow (NULL: none).
    pub grammar: *const llm_grammar,
}

pub type llm_spec_mode = c_uint;
pub const LLM_SPEC_NONE: llm_spec_mode = 0;
pub const LLM_SPEC_NGRAM: llm_spec_mode = 1;
pub const LLM_SPEC_DRAFT: llm_spec_mode = 2;
pub const LLM_SPEC_MAX_K: u32 = 32;

pub type llm_finish_reason = c_uint;
pub const LLM_FINISH_NONE: llm_finish_reason = 0;
pub const LLM_FINISH_EOS: llm_finish_reason = 1;
pub const LLM_FINISH_LENGTH: llm_finish_reason = 2;
pub const LLM_FINISH_STOP: llm_finish_reason = 3;
pub const LLM_FINISH_CANCELLED: llm_finish_reason = 4;
pub const LLM_FINISH_ERROR: llm_finish_reason = 5;

pub type llm_token_fn = Option<
    unsafe extern "C" fn(
        token: llm_token,
        piece: *const c_char,
        piece_len: usize,
        user: *mut c_void,
    ) -> bool,
>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_generate_params {
    pub struct_size: u32,
    pub max_new_tokens: u32,
    pub sampling: *const llm_sampling_params,
    pub on_token: llm_token_fn,
    pub user: *mut c_void,
    pub ignore_eos: bool,
    pub spec_mode: u32,
    pub spec_k: u32,
    /// Since 1.4: a LoRA adapter (`llm_adapter *`) and its scale.
    pub adapter: *const llm_adapter,
    pub adapter_scale: f32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_generate_result {
    pub struct_size: u32,
    pub finish_reason: llm_finish_reason,
    pub n_prompt_tokens: u32,
    pub n_generated_tokens: u32,
    pub prompt_seconds: f64,
    pub generate_seconds: f64,
    pub n_spec_steps: u32,
    pub n_draft_tokens: u32,
    pub n_accepted_tokens: u32,
}

pub type llm_request_id = u64;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_request_params {
    pub struct_size: u32,
    pub sampling: *const llm_sampling_params,
    pub max_new_tokens: u32,
    pub priority: i32,
    pub ignore_eos: bool,
    pub logprobs: bool,
    pub stop_tokens: *const llm_token,
    pub n_stop_tokens: usize,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub top_logprobs: u32,
    pub spec_mode: u32,
    pub spec_k: u32,
    pub n_samples: u32,
    /// Since 1.4: a LoRA adapter (`llm_adapter *`) and its scale.
    pub adapter: *const llm_adapter,
    pub adapter_scale: f32,
}

pub const LLM_MAX_SAMPLES: u32 = 256;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_event {
    pub request: llm_request_id,
    pub token: llm_token,
    pub text: *const c_char,
    pub text_len: usize,
    pub logprob: f32,
    pub finish_reason: llm_finish_reason,
    pub status: llm_status,
    pub top_tokens: *const llm_token,
    pub top_logprobs: *const f32,
    pub n_top: u32,
    pub sample_index: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_session_stats {
    pub struct_size: u32,
    pub n_running: u32,
    pub n_waiting: u32,
    pub block_size: u32,
    pub blocks_total: u32,
    pub blocks_used: u32,
    pub blocks_cached: u32,
    pub blocks_free: u32,
    pub kv_tokens_used: u64,
    pub prefix_hit_tokens: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub preemptions: u64,
    pub steps: u64,
    pub spec_steps: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
}

pub type llm_seq_id = i32;

#[repr(C)]
pub struct llm_batch {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct llm_sampler {
    _opaque: [u8; 0],
}

/// Experimental section of llm.h (`LLM_EXPERIMENTAL`): may change in a
/// minor release; its symbols sit in the LLMINFER_1.1 version node.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_backend_info {
    pub struct_size: u32,
    pub name: *const c_char,
    pub available: bool,
    pub n_devices: u32,
    pub reason: [c_char; 256],
}

/// Experimental, as [`llm_backend_info`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct llm_device_params {
    pub struct_size: u32,
    pub backend: *const c_char,
    pub devices: *const i32,
    pub n_devices: u32,
    pub tensor_parallel: u32,
}

extern "C" {
    pub fn llm_version_number() -> c_uint;
    pub fn llm_version_string() -> *const c_char;
    pub fn llm_struct_size(name: *const c_char) -> usize;
    pub fn llm_struct_offset(struct_name: *const c_char, field: *const c_char) -> usize;

    pub fn llm_status_str(status: llm_status) -> *const c_char;
    pub fn llm_status_name(status: llm_status) -> *const c_char;
    pub fn llm_last_error() -> *const c_char;

    pub fn llm_log_set(f: llm_log_fn, min_level: llm_log_level, user: *mut c_void);

    pub fn llm_model_params_init_sized(params: *mut llm_model_params, struct_size: usize);
    pub fn llm_model_load(
        path: *const c_char,
        params: *const llm_model_params,
        out: *mut *mut llm_model,
    ) -> llm_status;
    pub fn llm_model_free(model: *mut llm_model);
    pub fn llm_model_get_info(model: *const llm_model, info: *mut llm_model_info) -> llm_status;

    pub fn llm_tokenize(
        model: *const llm_model,
        text: *const c_char,
        text_len: usize,
        flags: u32,
        tokens: *mut llm_token,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> llm_status;
    pub fn llm_detokenize(
        model: *const llm_model,
        tokens: *const llm_token,
        n_tokens: usize,
        flags: u32,
        buf: *mut c_char,
        capacity: usize,
        n_bytes: *mut usize,
    ) -> llm_status;
    pub fn llm_detokenizer_create(
        model: *const llm_model,
        flags: u32,
        out: *mut *mut llm_detokenizer,
    ) -> llm_status;
    pub fn llm_detokenizer_push(
        detok: *mut llm_detokenizer,
        token: llm_token,
        buf: *mut c_char,
        capacity: usize,
        n_bytes: *mut usize,
    ) -> llm_status;
    pub fn llm_detokenizer_flush(
        detok: *mut llm_detokenizer,
        buf: *mut c_char,
        capacity: usize,
        n_bytes: *mut usize,
    ) -> llm_status;
    pub fn llm_detokenizer_free(detok: *mut llm_detokenizer);
    pub fn llm_chat_template_apply(
        model: *const llm_model,
        messages: *const llm_chat_message,
        n_messages: usize,
        add_generation_prompt: bool,
        buf: *mut c_char,
        capacity: usize,
        n_bytes: *mut usize,
    ) -> llm_status;

    pub fn llm_session_params_init_sized(params: *mut llm_session_params, struct_size: usize);
    pub fn llm_session_create(
        model: *const llm_model,
        params: *const llm_session_params,
        out: *mut *mut llm_session,
    ) -> llm_status;
    pub fn llm_session_free(session: *mut llm_session);
    pub fn llm_session_last_error(
        session: *mut llm_session,
        status: *mut llm_status,
        buf: *mut c_char,
        capacity: usize,
        n_bytes: *mut usize,
    ) -> llm_status;
    pub fn llm_session_interrupt(session: *mut llm_session);

    pub fn llm_sampling_params_init_sized(params: *mut llm_sampling_params, struct_size: usize);

    pub fn llm_generate_params_init_sized(params: *mut llm_generate_params, struct_size: usize);
    pub fn llm_generate(
        session: *mut llm_session,
        prompt: *const llm_token,
        n_prompt: usize,
        params: *const llm_generate_params,
        result: *mut llm_generate_result,
    ) -> llm_status;

    pub fn llm_request_params_init_sized(params: *mut llm_request_params, struct_size: usize);
    pub fn llm_session_submit(
        session: *mut llm_session,
        prompt: *const llm_token,
        n_prompt: usize,
        params: *const llm_request_params,
        out_id: *mut llm_request_id,
    ) -> llm_status;
    pub fn llm_session_cancel(session: *mut llm_session, id: llm_request_id) -> llm_status;
    pub fn llm_session_step(
        session: *mut llm_session,
        events: *mut llm_event,
        capacity: usize,
        event_size: usize,
        n_events: *mut usize,
    ) -> llm_status;
    pub fn llm_session_get_stats(
        session: *mut llm_session,
        stats: *mut llm_session_stats,
    ) -> llm_status;

    pub fn llm_seq_open(session: *mut llm_session, out: *mut llm_seq_id) -> llm_status;
    pub fn llm_seq_fork(
        session: *mut llm_session,
        src: llm_seq_id,
        out: *mut llm_seq_id,
    ) -> llm_status;
    pub fn llm_seq_close(session: *mut llm_session, seq: llm_seq_id) -> llm_status;
    pub fn llm_seq_truncate(
        session: *mut llm_session,
        seq: llm_seq_id,
        n_tokens: u32,
    ) -> llm_status;
    pub fn llm_seq_length(
        session: *mut llm_session,
        seq: llm_seq_id,
        n_tokens: *mut u32,
    ) -> llm_status;

    pub fn llm_batch_create(capacity: u32, out: *mut *mut llm_batch) -> llm_status;
    pub fn llm_batch_free(batch: *mut llm_batch);
    pub fn llm_batch_clear(batch: *mut llm_batch);
    pub fn llm_batch_add(
        batch: *mut llm_batch,
        seq: llm_seq_id,
        pos: u32,
        token: llm_token,
        want_logits: bool,
    ) -> llm_status;
    pub fn llm_session_decode(session: *mut llm_session, batch: *const llm_batch) -> llm_status;
    pub fn llm_session_logits(
        session: *mut llm_session,
        row: u32,
        logits: *mut *const f32,
    ) -> llm_status;

    pub fn llm_seq_tokens(
        session: *mut llm_session,
        seq: llm_seq_id,
        tokens: *mut llm_token,
        capacity: usize,
        n_tokens: *mut usize,
    ) -> llm_status;
    pub fn llm_seq_state_save(
        session: *mut llm_session,
        seq: llm_seq_id,
        buf: *mut c_void,
        capacity: usize,
        size: *mut usize,
    ) -> llm_status;
    pub fn llm_seq_state_load(
        session: *mut llm_session,
        data: *const c_void,
        size: usize,
        out: *mut llm_seq_id,
    ) -> llm_status;
    pub fn llm_seq_state_save_file(
        session: *mut llm_session,
        seq: llm_seq_id,
        path: *const c_char,
    ) -> llm_status;
    pub fn llm_seq_state_load_file(
        session: *mut llm_session,
        path: *const c_char,
        out: *mut llm_seq_id,
    ) -> llm_status;
    pub fn llm_session_state_save(
        session: *mut llm_session,
        buf: *mut c_void,
        capacity: usize,
        size: *mut usize,
    ) -> llm_status;
    pub fn llm_session_state_load(
        session: *mut llm_session,
        data: *const c_void,
        size: usize,
    ) -> llm_status;
    pub fn llm_session_state_save_file(
        session: *mut llm_session,
        path: *const c_char,
    ) -> llm_status;
    pub fn llm_session_state_load_file(
        session: *mut llm_session,
        path: *const c_char,
    ) -> llm_status;

    pub fn llm_sampler_create(
        model: *const llm_model,
        params: *const llm_sampling_params,
        stream: u64,
        out: *mut *mut llm_sampler,
    ) -> llm_status;
    pub fn llm_sampler_free(sampler: *mut llm_sampler);
    pub fn llm_sampler_sample(
        sampler: *mut llm_sampler,
        logits: *const f32,
        history: *const llm_token,
        n_history: usize,
        n_generated: u32,
        position: u64,
        out: *mut llm_token,
    ) -> llm_status;
    pub fn llm_sampler_logprobs(
        sampler: *mut llm_sampler,
        logits: *const f32,
        top_n: u32,
        tokens: *mut llm_token,
        logprobs: *mut f32,
        n_out: *mut u32,
    ) -> llm_status;

    // Experimental (LLM_EXPERIMENTAL in C).
    pub fn llm_backend_count() -> usize;
    pub fn llm_backend_get_info(index: usize, info: *mut llm_backend_info) -> llm_status;
    pub fn llm_device_params_init_sized(params: *mut llm_device_params, struct_size: usize);
    pub fn llm_session_create_ex(
        model: *const llm_model,
        params: *const llm_session_params,
        device: *const llm_device_params,
        out: *mut *mut llm_session,
    ) -> llm_status;

    // Grammars (since 1.3).
    pub fn llm_grammar_params_init_sized(params: *mut llm_grammar_params, struct_size: usize);
    pub fn llm_grammar_compile_json_schema(
        model: *const llm_model,
        schema: *const c_char,
        len: usize,
        params: *const llm_grammar_params,
        out: *mut *mut llm_grammar,
    ) -> llm_status;
    pub fn llm_grammar_compile_ebnf(
        model: *const llm_model,
        text: *const c_char,
        len: usize,
        params: *const llm_grammar_params,
        out: *mut *mut llm_grammar,
    ) -> llm_status;
    pub fn llm_grammar_compile_regex(
        model: *const llm_model,
        regex: *const c_char,
        len: usize,
        params: *const llm_grammar_params,
        out: *mut *mut llm_grammar,
    ) -> llm_status;
    pub fn llm_grammar_free(grammar: *mut llm_grammar);

    // LoRA adapters (since 1.4).
    pub fn llm_adapter_params_init_sized(params: *mut llm_adapter_params, struct_size: usize);
    pub fn llm_adapter_load(
        model: *const llm_model,
        path: *const c_char,
        params: *const llm_adapter_params,
        out: *mut *mut llm_adapter,
    ) -> llm_status;
    pub fn llm_adapter_free(adapter: *mut llm_adapter);
    pub fn llm_seq_set_adapter(
        session: *mut llm_session,
        seq: llm_seq_id,
        adapter: *const llm_adapter,
        scale: f32,
    ) -> llm_status;
}

/// Byte offset of `$field` in `$ty`, for toolchains without
/// `core::mem::offset_of!` (stable only since Rust 1.77).
#[macro_export]
macro_rules! offset_of {
    ($ty:ty, $field:ident) => {{
        let probe = ::core::mem::MaybeUninit::<$ty>::uninit();
        let base = probe.as_ptr();
        // addr_of! never reads the (uninitialised) field.
        #[allow(unused_unsafe)]
        let field = unsafe { ::core::ptr::addr_of!((*base).$field) };
        (field as *const u8 as usize) - (base as *const u8 as usize)
    }};
}

/// One struct as this crate declares it: its C name, `size_of` and the
/// offset of every field, by C field name.
#[derive(Debug, Clone)]
pub struct StructLayout {
    pub name: &'static str,
    pub size: usize,
    pub fields: Vec<(&'static str, usize)>,
}

macro_rules! layouts {
    ($($ty:ident { $($field:ident),* $(,)? })*) => {
        // A pattern without `..` must name every field, so a field left out
        // of the table below (or added to a struct but not to the table)
        // does not compile.
        #[allow(dead_code, non_snake_case)]
        fn every_field_is_listed($($ty: $ty),*) {
            $(let $ty { $($field: _),* } = $ty;)*
        }

        /// Every `#[repr(C)]` struct of this crate with its layout.
        pub fn struct_layouts() -> Vec<StructLayout> {
            vec![$(StructLayout {
                name: stringify!($ty),
                size: ::core::mem::size_of::<$ty>(),
                fields: vec![$((stringify!($field), offset_of!($ty, $field))),*],
            }),*]
        }
    };
}

layouts! {
    llm_model_params { struct_size, use_mmap, error_message, error_capacity, progress, progress_user }
    llm_model_info {
        struct_size, architecture, name, n_params, weight_bytes, n_layers, n_embd, n_heads,
        n_kv_heads, n_ff, n_vocab, n_ctx_train, bos, eos, eot, pad, has_chat_template,
    }
    llm_chat_message { role, content }
    llm_session_params {
        struct_size, n_threads, n_ctx, max_batch_tokens, kv_cache_bytes, kv_type,
        kv_block_size, prefix_cache, draft_model, error_message, error_capacity, progress,
        progress_user,
    }
    llm_logit_bias { token, bias }
    llm_sampling_params {
        struct_size, temperature, top_k, top_p, min_p, seed, repeat_penalty, repeat_last_n,
        presence_penalty, frequency_penalty, logit_bias, n_logit_bias, min_tokens, grammar,
    }
    llm_generate_params {
        struct_size, max_new_tokens, sampling, on_token, user, ignore_eos, spec_mode, spec_k,
        adapter, adapter_scale,
    }
    llm_generate_result {
        struct_size, finish_reason, n_prompt_tokens, n_generated_tokens, prompt_seconds,
        generate_seconds, n_spec_steps, n_draft_tokens, n_accepted_tokens,
    }
    llm_request_params {
        struct_size, sampling, max_new_tokens, priority, ignore_eos, logprobs, stop_tokens,
        n_stop_tokens, stop_strings, n_stop_strings, top_logprobs, spec_mode, spec_k, n_samples,
        adapter, adapter_scale,
    }
    llm_event {
        request, token, text, text_len, logprob, finish_reason, status, top_tokens,
        top_logprobs, n_top, sample_index,
    }
    llm_session_stats {
        struct_size, n_running, n_waiting, block_size, blocks_total, blocks_used,
        blocks_cached, blocks_free, kv_tokens_used, prefix_hit_tokens, prompt_tokens,
        generated_tokens, preemptions, steps, spec_steps, spec_draft_tokens,
        spec_accepted_tokens,
    }
    llm_backend_info { struct_size, name, available, n_devices, reason }
    llm_device_params { struct_size, backend, devices, n_devices, tensor_parallel }
    llm_grammar_params { struct_size, whitespace, root }
    llm_adapter_params { struct_size, use_mmap }
}

/// Compares [`struct_layouts`] with the loaded library's
/// `llm_struct_size` / `llm_struct_offset` and describes every difference;
/// an empty list means the declarations match the library.
pub fn layout_mismatches() -> Vec<String> {
    use std::ffi::CString;
    let mut problems = Vec::new();
    for layout in struct_layouts() {
        let name = CString::new(layout.name).expect("struct names have no NUL");
        let size = unsafe { llm_struct_size(name.as_ptr()) };
        if size != layout.size {
            problems.push(format!(
                "{}: library size {}, declared {}",
                layout.name, size, layout.size
            ));
        }
        for (field, offset) in &layout.fields {
            let field_name = CString::new(*field).expect("field names have no NUL");
            let lib_offset = unsafe { llm_struct_offset(name.as_ptr(), field_name.as_ptr()) };
            if lib_offset != *offset {
                problems.push(format!(
                    "{}.{}: library offset {}, declared {}",
                    layout.name,
                    field,
                    if lib_offset == usize::MAX {
                        "unknown".to_string()
                    } else {
                        lib_offset.to_string()
                    },
                    offset
                ));
            }
        }
    }
    problems
}
