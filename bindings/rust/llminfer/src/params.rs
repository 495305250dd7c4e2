//! Options of sessions, sampling, generation and requests. Every `Default`
//! is read from the library's `*_params_init_sized`, so it is the library's.

use crate::adapter::Adapter;
use crate::error::{c_string, Result};
use crate::grammar::Grammar;
use crate::model::{Model, Token};
use llminfer_sys as sys;
use std::ffi::CString;
use std::os::raw::c_char;

macro_rules! library_defaults {
    ($raw:ty, $init:path) => {{
        let mut raw: $raw = unsafe { std::mem::zeroed() };
        unsafe { $init(&mut raw, std::mem::size_of::<$raw>()) };
        raw
    }};
}

/// Element type of the cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    BF16,
    /// Since libllminfer 1.4: GGUF Q8_0 blocks of 32 per head row (head_dim a multiple of 32).
    Q8_0,
    /// Since libllminfer 1.4: GGUF Q4_0 blocks of 32 per head row (head_dim a multiple of 32).
    Q4_0,
}

impl KvType {
    fn to_raw(self) -> sys::llm_kv_type {
        match self {
            KvType::F32 => sys::LLM_KV_F32,
            KvType::F16 => sys::LLM_KV_F16,
            KvType::BF16 => sys::LLM_KV_BF16,
            KvType::Q8_0 => sys::LLM_KV_Q8_0,
            KvType::Q4_0 => sys::LLM_KV_Q4_0,
        }
    }
    fn from_raw(raw: sys::llm_kv_type) -> KvType {
        match raw {
            sys::LLM_KV_F16 => KvType::F16,
            sys::LLM_KV_BF16 => KvType::BF16,
            sys::LLM_KV_Q8_0 => KvType::Q8_0,
            sys::LLM_KV_Q4_0 => KvType::Q4_0,
            _ => KvType::F32,
        }
    }
}

/// How speculative decoding proposes drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecMode {
    None,
    /// Prompt lookup.
    Ngram,
    /// The session's draft model.
    Draft,
}

impl SpecMode {
    fn to_raw(self) -> u32 {
        match self {
            SpecMode::None => sys::LLM_SPEC_NONE,
            SpecMode::Ngram => sys::LLM_SPEC_NGRAM,
            SpecMode::Draft => sys::LLM_SPEC_DRAFT,
        }
    }
    fn from_raw(raw: u32) -> SpecMode {
        match raw {
            sys::LLM_SPEC_NGRAM => SpecMode::Ngram,
            sys::LLM_SPEC_DRAFT => SpecMode::Draft,
            _ => SpecMode::None,
        }
    }
}

/// Why a generation or request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or end-of-turn token.
    Eos,
    /// max_new_tokens or the context length.
    Length,
    /// A stop token or stop string.
    Stop,
    /// Cancelled, interrupted, or the callback asked to stop.
    Cancelled,
    /// The request could not go on; the event carries the status.
    Error,
    /// A reason newer than these bindings.
    Other(u32),
}

impl FinishReason {
    pub(crate) fn from_raw(raw: sys::llm_finish_reason) -> Option<FinishReason> {
        match raw {
            sys::LLM_FINISH_NONE => None,
            sys::LLM_FINISH_EOS => Some(FinishReason::Eos),
            sys::LLM_FINISH_LENGTH => Some(FinishReason::Length),
            sys::LLM_FINISH_STOP => Some(FinishReason::Stop),
            sys::LLM_FINISH_CANCELLED => Some(FinishReason::Cancelled),
            sys::LLM_FINISH_ERROR => Some(FinishReason::Error),
            other => Some(FinishReason::Other(other)),
        }
    }
}

/// Options of [`Session::new`](crate::Session::new).
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// 0 = one per online CPU.
    pub n_threads: u32,
    /// Max tokens per sequence; 0 = the model's training context.
    pub n_ctx: u32,
    pub max_batch_tokens: u32,
    /// KV memory; 0 = the library's choice.
    pub kv_cache_bytes: u64,
    pub kv_type: KvType,
    /// Tokens per KV block; 0 = the library's default.
    pub kv_block_size: u32,
    pub prefix_cache: bool,
    /// Draft model for [`SpecMode::Draft`]; the session keeps it alive.
    pub draft_model: Option<Model>,
}

impl Default for SessionParams {
    fn default() -> Self {
        let raw = library_defaults!(sys::llm_session_params, sys::llm_session_params_init_sized);
        SessionParams {
            n_threads: raw.n_threads,
            n_ctx: raw.n_ctx,
            max_batch_tokens: raw.max_batch_tokens,
            kv_cache_bytes: raw.kv_cache_bytes,
            kv_type: KvType::from_raw(raw.kv_type),
            kv_block_size: raw.kv_block_size,
            prefix_cache: raw.prefix_cache,
            draft_model: None,
        }
    }
}

impl SessionParams {
    /// The C struct, without the error buffer (the caller adds it).
    pub(crate) fn to_raw(&self) -> sys::llm_session_params {
        let mut raw =
            library_defaults!(sys::llm_session_params, sys::llm_session_params_init_sized);
        raw.n_threads = self.n_threads;
        raw.n_ctx = self.n_ctx;
        raw.max_batch_tokens = self.max_batch_tokens;
        raw.kv_cache_bytes = self.kv_cache_bytes;
        raw.kv_type = self.kv_type.to_raw();
        raw.kv_block_size = self.kv_block_size;
        raw.prefix_cache = self.prefix_cache;
        raw.draft_model = self
            .draft_model
            .as_ref()
            .map_or(std::ptr::null(), |m| m.as_ptr());
        raw
    }
}

/// How the next token is chosen (see llm.h for the pipeline).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
    pub repeat_penalty: f32,
    pub repeat_last_n: i32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// (token, bias) pairs; `f32::NEG_INFINITY` bans a token.
    pub logit_bias: Vec<(Token, f32)>,
    pub min_tokens: u32,
    /// Only tokens the grammar allows next (compiled for the same model);
    /// `None` = unconstrained. Generation ends when the grammar is complete.
    pub grammar: Option<Grammar>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        let raw = library_defaults!(
            sys::llm_sampling_params,
            sys::llm_sampling_params_init_sized
        );
        SamplingParams {
            temperature: raw.temperature,
            top_k: raw.top_k,
            top_p: raw.top_p,
            min_p: raw.min_p,
            seed: raw.seed,
            repeat_penalty: raw.repeat_penalty,
            repeat_last_n: raw.repeat_last_n,
            presence_penalty: raw.presence_penalty,
            frequency_penalty: raw.frequency_penalty,
            logit_bias: Vec::new(),
            min_tokens: raw.min_tokens,
            grammar: None,
        }
    }
}

impl SamplingParams {
    /// The largest logit wins.
    pub fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        }
    }

    /// The library's defaults with this seed.
    pub fn seeded(seed: u64) -> SamplingParams {
        SamplingParams {
            seed,
            ..SamplingParams::default()
        }
    }
}

/// A C sampling struct and the memory its pointers point into; boxed so
/// that the address handed to C stays put when this moves.
pub(crate) struct RawSampling {
    pub raw: Box<sys::llm_sampling_params>,
    _bias: Vec<sys::llm_logit_bias>,
}

impl RawSampling {
    pub fn new(params: &SamplingParams) -> RawSampling {
        let bias: Vec<sys::llm_logit_bias> = params
            .logit_bias
            .iter()
            .map(|&(token, bias)| sys::llm_logit_bias { token, bias })
            .collect();
        let mut raw = Box::new(library_defaults!(
            sys::llm_sampling_params,
            sys::llm_sampling_params_init_sized
        ));
        raw.temperature = params.temperature;
        raw.top_k = params.top_k;
        raw.top_p = params.top_p;
        raw.min_p = params.min_p;
        raw.seed = params.seed;
        raw.repeat_penalty = params.repeat_penalty;
        raw.repeat_last_n = params.repeat_last_n;
        raw.presence_penalty = params.presence_penalty;
        raw.frequency_penalty = params.frequency_penalty;
        raw.logit_bias = if bias.is_empty() {
            std::ptr::null()
        } else {
            bias.as_ptr()
        };
        raw.n_logit_bias = bias.len();
        raw.min_tokens = params.min_tokens;
        raw.grammar = params
            .grammar
            .as_ref()
            .map_or(std::ptr::null(), |g| g.as_ptr());
        RawSampling { raw, _bias: bias }
    }

    pub fn ptr(sampling: &Option<RawSampling>) -> *const sys::llm_sampling_params {
        sampling
            .as_ref()
            .map_or(std::ptr::null(), |s| &*s.raw as *const _)
    }
}

/// Options of [`Session::generate`](crate::Session::generate).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    pub max_new_tokens: u32,
    /// `None` = greedy.
    pub sampling: Option<SamplingParams>,
    pub ignore_eos: bool,
    pub spec_mode: SpecMode,
    /// Drafts per step; 0 = adaptive.
    pub spec_k: u32,
    /// A LoRA adapter of the session's model (`None`: the base model).
    pub adapter: Option<Adapter>,
    /// Multiplies the adapter's alpha / rank (default 1; 0 gives the base model's output).
    pub adapter_scale: f32,
}

impl Default for GenerateParams {
    fn default() -> Self {
        let raw = library_defaults!(
            sys::llm_generate_params,
            sys::llm_generate_params_init_sized
        );
        GenerateParams {
            max_new_tokens: raw.max_new_tokens,
            sampling: None,
            ignore_eos: raw.ignore_eos,
            spec_mode: SpecMode::from_raw(raw.spec_mode),
            spec_k: raw.spec_k,
            adapter: None,
            adapter_scale: 1.0,
        }
    }
}

impl GenerateParams {
    /// Greedy decoding of at most `max_new_tokens` tokens.
    pub fn greedy(max_new_tokens: u32) -> GenerateParams {
        GenerateParams {
            max_new_tokens,
            ..GenerateParams::default()
        }
    }

    pub(crate) fn raw_defaults() -> sys::llm_generate_params {
        library_defaults!(
            sys::llm_generate_params,
            sys::llm_generate_params_init_sized
        )
    }
}

/// Options of [`Session::submit`](crate::Session::submit).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestParams {
    /// `None` = greedy.
    pub sampling: Option<SamplingParams>,
    pub max_new_tokens: u32,
    /// Higher is admitted first.
    pub priority: i32,
    pub ignore_eos: bool,
    /// Report each token's log-probability.
    pub logprobs: bool,
    /// Generation stops after one of these.
    pub stop_tokens: Vec<Token>,
    /// Generation stops at one of these; their text is never emitted.
    pub stop_strings: Vec<String>,
    /// Report this many most likely tokens with each token (at most 20).
    pub top_logprobs: u32,
    pub spec_mode: SpecMode,
    pub spec_k: u32,
    /// Independent completions of the prompt (1 = one).
    pub n_samples: u32,
    /// A LoRA adapter of the session's model (`None`: the base model). The
    /// session keeps it alive until the request finishes.
    pub adapter: Option<Adapter>,
    /// Multiplies the adapter's alpha / rank (default 1; 0 gives the base model's output).
    pub adapter_scale: f32,
}

impl Default for RequestParams {
    fn default() -> Self {
        let raw = library_defaults!(sys::llm_request_params, sys::llm_request_params_init_sized);
        RequestParams {
            sampling: None,
            max_new_tokens: raw.max_new_tokens,
            priority: raw.priority,
            ignore_eos: raw.ignore_eos,
            logprobs: raw.logprobs,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            top_logprobs: raw.top_logprobs,
            spec_mode: SpecMode::from_raw(raw.spec_mode),
            spec_k: raw.spec_k,
            n_samples: raw.n_samples,
            adapter: None,
            adapter_scale: 1.0,
        }
    }
}

impl RequestParams {
    /// Greedy decoding of at most `max_new_tokens` tokens.
    pub fn greedy(max_new_tokens: u32) -> RequestParams {
        RequestParams {
            max_new_tokens,
            ..RequestParams::default()
        }
    }

    /// How many finish events end the request.
    pub(crate) fn samples(&self) -> u32 {
        self.n_samples.max(1)
    }
}

/// A C request struct and everything its pointers point into.
pub(crate) struct RawRequest {
    pub raw: sys::llm_request_params,
    _sampling: Option<RawSampling>,
    _stop_tokens: Vec<Token>,
    _stop_strings: Vec<CString>,
    _stop_pointers: Vec<*const c_char>,
}

impl RawRequest {
    pub fn new(params: &RequestParams) -> Result<RawRequest> {
        let sampling = params.sampling.as_ref().map(RawSampling::new);
        let stop_tokens = params.stop_tokens.clone();
        let mut stop_strings = Vec::with_capacity(params.stop_strings.len());
        for text in &params.stop_strings {
            stop_strings.push(c_string(text, "a stop string")?);
        }
        let stop_pointers: Vec<*const c_char> = stop_strings.iter().map(|s| s.as_ptr()).collect();
        let mut raw =
            library_defaults!(sys::llm_request_params, sys::llm_request_params_init_sized);
        raw.sampling = RawSampling::ptr(&sampling);
        raw.max_new_tokens = params.max_new_tokens;
        raw.priority = params.priority;
        raw.ignore_eos = params.ignore_eos;
        raw.logprobs = params.logprobs;
        raw.stop_tokens = if stop_tokens.is_empty() {
            std::ptr::null()
        } else {
            stop_tokens.as_ptr()
        };
        raw.n_stop_tokens = stop_tokens.len();
        raw.stop_strings = if stop_pointers.is_empty() {
            std::ptr::null()
        } else {
            stop_pointers.as_ptr()
        };
        raw.n_stop_strings = stop_pointers.len();
        raw.top_logprobs = params.top_logprobs;
        raw.spec_mode = params.spec_mode.to_raw();
        raw.spec_k = params.spec_k;
        raw.n_samples = params.n_samples;
        raw.adapter = params
            .adapter
            .as_ref()
            .map_or(std::ptr::null(), |a| a.as_ptr());
        raw.adapter_scale = params.adapter_scale;
        Ok(RawRequest {
            raw,
            _sampling: sampling,
            _stop_tokens: stop_tokens,
            _stop_strings: stop_strings,
            _stop_pointers: stop_pointers,
        })
    }
}

pub(crate) fn spec_mode_raw(mode: SpecMode) -> u32 {
    mode.to_raw()
}
