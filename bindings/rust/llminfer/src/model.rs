//! Models, the tokenizer and chat templates.

use crate::error::{c_string, c_text, check, read_text, Error, Result, Status};
use llminfer_sys as sys;
use std::ffi::CString;
use std::os::raw::c_char;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A token id in the model's vocabulary.
pub type Token = i32;

macro_rules! flag_set {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $flag:ident = $value:expr;)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            pub const NONE: $name = $name(0);
            $($(#[$fdoc])* pub const $flag: $name = $name($value);)*

            pub fn bits(self) -> u32 {
                self.0
            }

            pub fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }
        }

        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }
        }
    };
}

flag_set! {
    /// Flags of [`Model::tokenize`].
    TokenizeFlags {
        /// Add the model's BOS token (and EOS where the model asks for it).
        ADD_SPECIAL = sys::LLM_TOKENIZE_ADD_SPECIAL;
        /// Turn special-token text such as `<|im_start|>` into its token.
        PARSE_SPECIAL = sys::LLM_TOKENIZE_PARSE_SPECIAL;
        /// Refuse bytes the vocabulary has no token for instead of dropping them.
        STRICT = sys::LLM_TOKENIZE_STRICT;
    }
}

flag_set! {
    /// Flags of [`Model::detokenize`] and [`Detokenizer`].
    DetokenizeFlags {
        /// Render control tokens (`<|im_end|>`) as text instead of skipping them.
        SPECIAL = sys::LLM_DETOKENIZE_SPECIAL;
    }
}

static LAYOUTS_CHECKED: AtomicBool = AtomicBool::new(false);

/// Fails when the loaded library's structs are not laid out as this crate
/// declares them (a library built from another header): every call would
/// then read garbage. Checked once, before the first model loads.
pub fn check_library() -> Result<()> {
    if LAYOUTS_CHECKED.load(Ordering::Acquire) {
        return Ok(());
    }
    let problems = sys::layout_mismatches();
    if !problems.is_empty() {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "libllminfer {} does not match these bindings: {}",
                crate::version(),
                problems.join("; ")
            ),
        ));
    }
    LAYOUTS_CHECKED.store(true, Ordering::Release);
    Ok(())
}

/// Options of [`Model::load_with`]; `Default` gives the library's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelParams {
    /// Map the file instead of reading it into memory.
    pub use_mmap: bool,
}

impl Default for ModelParams {
    fn default() -> Self {
        let raw = raw_model_params();
        ModelParams {
            use_mmap: raw.use_mmap,
        }
    }
}

fn raw_model_params() -> sys::llm_model_params {
    unsafe {
        let mut raw: sys::llm_model_params = std::mem::zeroed();
        sys::llm_model_params_init_sized(&mut raw, std::mem::size_of::<sys::llm_model_params>());
        raw
    }
}

/// Facts about a loaded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub architecture: String,
    pub name: String,
    pub n_params: u64,
    pub weight_bytes: u64,
    pub n_layers: u32,
    pub n_embd: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub n_ff: u32,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub bos: Option<Token>,
    pub eos: Option<Token>,
    pub eot: Option<Token>,
    pub pad: Option<Token>,
    pub has_chat_template: bool,
}

/// One chat message for [`Model::apply_chat_template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

struct RawModel(*mut sys::llm_model);

// The library documents a loaded model as immutable and thread-safe.
unsafe impl Send for RawModel {}
unsafe impl Sync for RawModel {}

impl Drop for RawModel {
    fn drop(&mut self) {
        unsafe { sys::llm_model_free(self.0) }
    }
}

/// A loaded model: weights, hyper-parameters and tokenizer. Cloning is
/// cheap (shared); the model is freed when the last clone and the last
/// session or detokenizer using it are gone.
#[derive(Clone)]
pub struct Model {
    raw: Arc<RawModel>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("ptr", &self.raw.0).finish()
    }
}

pub(crate) fn path_to_c(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| Error::new(Status::InvalidArgument, "the path is not valid Unicode"))?
        .as_bytes()
        .to_vec();
    CString::new(bytes)
        .map_err(|_| Error::new(Status::InvalidArgument, "the path contains a NUL byte"))
}

impl Model {
    /// Loads a GGUF model with default options.
    pub fn load<P: AsRef<Path>>(path: P) -> Result<Model> {
        Model::load_with(path, &ModelParams::default())
    }

    pub fn load_with<P: AsRef<Path>>(path: P, params: &ModelParams) -> Result<Model> {
        check_library()?;
        let c_path = path_to_c(path.as_ref())?;
        let mut message = vec![0u8; 1024];
        let mut raw = raw_model_params();
        raw.use_mmap = params.use_mmap;
        raw.error_message = message.as_mut_ptr() as *mut c_char;
        raw.error_capacity = message.len();
        let mut out: *mut sys::llm_model = std::ptr::null_mut();
        let status = unsafe { sys::llm_model_load(c_path.as_ptr(), &raw, &mut out) };
        if status != sys::LLM_OK {
            return Err(Error::from_code(status, buffer_text(&message)));
        }
        Ok(Model {
            raw: Arc::new(RawModel(out)),
        })
    }

    /// The C handle, for calls this crate does not wrap. It stays valid
    /// while this `Model` (or a clone) lives.
    pub fn as_ptr(&self) -> *const sys::llm_model {
        self.raw.0
    }

    pub fn info(&self) -> Result<ModelInfo> {
        let mut raw: sys::llm_model_info = unsafe { std::mem::zeroed() };
        raw.struct_size = std::mem::size_of::<sys::llm_model_info>() as u32;
        check(unsafe { sys::llm_model_get_info(self.raw.0, &mut raw) })?;
        let token = |t: Token| {
            if t == sys::LLM_TOKEN_NONE {
                None
            } else {
                Some(t)
            }
        };
        Ok(ModelInfo {
            architecture: unsafe { c_text(raw.architecture) },
            name: unsafe { c_text(raw.name) },
            n_params: raw.n_params,
            weight_bytes: raw.weight_bytes,
            n_layers: raw.n_layers,
            n_embd: raw.n_embd,
            n_heads: raw.n_heads,
            n_kv_heads: raw.n_kv_heads,
            n_ff: raw.n_ff,
            n_vocab: raw.n_vocab,
            n_ctx_train: raw.n_ctx_train,
            bos: token(raw.bos),
            eos: token(raw.eos),
            eot: token(raw.eot),
            pad: token(raw.pad),
            has_chat_template: raw.has_chat_template,
        })
    }

    /// Turns text into tokens.
    pub fn tokenize(&self, text: &str, flags: TokenizeFlags) -> Result<Vec<Token>> {
        let mut tokens: Vec<Token> = vec![0; text.len() + 8];
        for _ in 0..3 {
            let mut n = 0usize;
            let status = unsafe {
                sys::llm_tokenize(
                    self.raw.0,
                    text.as_ptr() as *const c_char,
                    text.len(),
                    flags.bits(),
                    tokens.as_mut_ptr(),
                    tokens.len(),
                    &mut n,
                )
            };
            if status == sys::LLM_ERR_BUFFER_TOO_SMALL && n > tokens.len() {
                tokens.resize(n, 0);
                continue;
            }
            check(status)?;
            tokens.truncate(n);
            return Ok(tokens);
        }
        Err(Error::new(
            Status::BufferTooSmall,
            "the token count kept growing",
        ))
    }

    /// Turns tokens back into text.
    pub fn detokenize(&self, tokens: &[Token], flags: DetokenizeFlags) -> Result<String> {
        read_text(|buf, capacity, n_bytes| unsafe {
            sys::llm_detokenize(
                self.raw.0,
                tokens.as_ptr(),
                tokens.len(),
                flags.bits(),
                buf,
                capacity,
                n_bytes,
            )
        })
    }

    /// Renders `messages` with the model's chat template; with
    /// `add_generation_prompt` the text ends where the assistant's reply starts.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let mut strings = Vec::with_capacity(messages.len() * 2);
        for message in messages {
            strings.push(c_string(&message.role, "a chat role")?);
            strings.push(c_string(&message.content, "a chat message")?);
        }
        let raw: Vec<sys::llm_chat_message> = strings
            .chunks(2)
            .map(|pair| sys::llm_chat_message {
                role: pair[0].as_ptr(),
                content: pair[1].as_ptr(),
            })
            .collect();
        read_text(|buf, capacity, n_bytes| unsafe {
            sys::llm_chat_template_apply(
                self.raw.0,
                raw.as_ptr(),
                raw.len(),
                add_generation_prompt,
                buf,
                capacity,
                n_bytes,
            )
        })
    }

    /// A streaming detokenizer for this model.
    pub fn detokenizer(&self, flags: DetokenizeFlags) -> Result<Detokenizer> {
        let mut out = std::ptr::null_mut();
        check(unsafe { sys::llm_detokenizer_create(self.raw.0, flags.bits(), &mut out) })?;
        Ok(Detokenizer {
            raw: out,
            _model: self.clone(),
        })
    }
}

/// The text of a NUL-terminated message the library wrote into `buf`.
pub(crate) fn buffer_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Turns tokens into text one at a time, holding back the bytes of a
/// character split across tokens until it is complete.
pub struct Detokenizer {
    raw: *mut sys::llm_detokenizer,
    _model: Model,
}

// One owner at a time may use it from any thread; it is not shareable.
unsafe impl Send for Detokenizer {}

impl Detokenizer {
    /// Adds a token and returns the text it completes (possibly empty).
    pub fn push(&mut self, token: Token) -> Result<String> {
        let raw = self.raw;
        read_text(|buf, capacity, n_bytes| unsafe {
            sys::llm_detokenizer_push(raw, token, buf, capacity, n_bytes)
        })
    }

    /// Returns what is held back (incomplete characters as U+FFFD) and resets.
    pub fn flush(&mut self) -> Result<String> {
        let raw = self.raw;
        read_text(|buf, capacity, n_bytes| unsafe {
            sys::llm_detokenizer_flush(raw, buf, capacity, n_bytes)
        })
    }
}

impl Drop for Detokenizer {
    fn drop(&mut self) {
        unsafe { sys::llm_detokenizer_free(self.raw) }
    }
}
