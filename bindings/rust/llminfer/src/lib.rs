//! Safe Rust bindings for libllminfer, an embeddable LLM inference library.
//!
//! ```no_run
//! use llminfer::{ChatMessage, Model, RequestParams, Session, SessionParams, TokenizeFlags};
//!
//! # fn main() -> Result<(), llminfer::Error> {
//! let model = Model::load("model.gguf")?;
//! let prompt = model.apply_chat_template(&[ChatMessage::user("Hello!")], true)?;
//! let tokens = model.tokenize(&prompt, TokenizeFlags::ADD_SPECIAL | TokenizeFlags::PARSE_SPECIAL)?;
//! let mut session = Session::new(&model, &SessionParams::default())?;
//! for event in session.stream(&tokens, &RequestParams::greedy(64))? {
//!     print!("{}", event?.text);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Threads: [`Model`] is `Send + Sync` and cheap to clone. A [`Session`] is
//! `Send` but not `Sync`: one thread steps it. [`SessionHandle`] is `Send +
//! Sync` and offers the calls llm.h allows from any thread while another
//! steps: submit, cancel and interrupt.
//!
//! LoRA adapters ([`Adapter`]) and grammars ([`Grammar`]) are `Send +
//! Sync` and cheap to clone; a session keeps the ones its requests and
//! sequences use alive until they end.

mod adapter;
mod error;
mod grammar;
mod log;
mod model;
mod params;
mod session;
mod stream;
mod tokens;

pub use adapter::{Adapter, AdapterParams};
pub use error::{Error, Result, Status};
pub use grammar::{Grammar, GrammarParams, GrammarWhitespace};
pub use llminfer_sys as sys;
pub use log::{clear_log_sink, set_log_sink, LogLevel};
pub use model::{
    check_library, ChatMessage, DetokenizeFlags, Detokenizer, Model, ModelInfo, ModelParams, Token,
    TokenizeFlags,
};
pub use params::{
    FinishReason, GenerateParams, KvType, RequestParams, SamplingParams, SessionParams, SpecMode,
};
pub use session::{
    DeviceParams, Event, GenerateResult, Generation, RequestId, Session, SessionHandle,
    SessionStats,
};
pub use stream::Stream;
pub use tokens::{Batch, Sampler, SeqId};

/// The loaded library's version, e.g. "1.2.0".
pub fn version() -> String {
    unsafe { error::c_text(sys::llm_version_string()) }
}

/// The loaded library's version as MAJOR * 10000 + MINOR * 100 + PATCH.
pub fn version_number() -> u32 {
    unsafe { sys::llm_version_number() }
}
