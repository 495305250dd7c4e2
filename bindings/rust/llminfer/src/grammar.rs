//! Grammars (API 1.3; docs/structured-output.md): output constrained to a
//! JSON Schema, a GBNF grammar or a regular expression.

use crate::error::{c_string, check, Result};
use crate::model::Model;
use llminfer_sys as sys;
use std::os::raw::c_char;
use std::sync::Arc;

/// Whitespace a JSON-Schema grammar allows between tokens of JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrammarWhitespace {
    /// None: `{"a":1,"b":[true]}` (the library's default).
    Compact,
    /// Optional: one space, or a newline and indentation.
    Flexible,
}

/// Options of the grammar compilers; `Default` gives the library's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarParams {
    /// For JSON Schemas.
    pub whitespace: GrammarWhitespace,
    /// For EBNF: the start rule (`None`: `root`).
    pub root: Option<String>,
}

impl Default for GrammarParams {
    fn default() -> Self {
        GrammarParams {
            whitespace: GrammarWhitespace::Compact,
            root: None,
        }
    }
}

struct RawGrammar {
    ptr: *mut sys::llm_grammar,
    _model: Model,
}

// llm.h: a compiled grammar is immutable and shareable by any number of
// samplers and requests, on any threads.
unsafe impl Send for RawGrammar {}
unsafe impl Sync for RawGrammar {}

impl Drop for RawGrammar {
    fn drop(&mut self) {
        unsafe { sys::llm_grammar_free(self.ptr) }
    }
}

/// A grammar compiled for one model's vocabulary; put it in
/// [`SamplingParams::grammar`](crate::SamplingParams::grammar). Cloning is
/// cheap (shared). Requests, generations and samplers that use it keep it
/// alive until they end, so the library never reads a freed grammar.
#[derive(Clone)]
pub struct Grammar {
    raw: Arc<RawGrammar>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("ptr", &self.raw.ptr)
            .finish()
    }
}

/// The same compiled grammar (not: the same text).
impl PartialEq for Grammar {
    fn eq(&self, other: &Grammar) -> bool {
        Arc::ptr_eq(&self.raw, &other.raw)
    }
}

type Compiler = unsafe extern "C" fn(
    *const sys::llm_model,
    *const c_char,
    usize,
    *const sys::llm_grammar_params,
    *mut *mut sys::llm_grammar,
) -> sys::llm_status;

impl Grammar {
    /// Compiles a JSON Schema (`llm_grammar_compile_json_schema`): output
    /// is JSON that the schema accepts. An unsupported keyword is
    /// [`Status::Unsupported`](crate::Status::Unsupported), malformed JSON
    /// [`Status::InvalidArgument`](crate::Status::InvalidArgument); the
    /// message says where.
    pub fn json_schema(model: &Model, schema: &str, params: &GrammarParams) -> Result<Grammar> {
        Grammar::compile(model, schema, params, sys::llm_grammar_compile_json_schema)
    }

    /// Compiles a grammar in GBNF notation (`llm_grammar_compile_ebnf`);
    /// errors give the line:column.
    pub fn ebnf(model: &Model, text: &str, params: &GrammarParams) -> Result<Grammar> {
        Grammar::compile(model, text, params, sys::llm_grammar_compile_ebnf)
    }

    /// Compiles a regular expression the whole output must match
    /// (`llm_grammar_compile_regex`).
    pub fn regex(model: &Model, regex: &str, params: &GrammarParams) -> Result<Grammar> {
        Grammar::compile(model, regex, params, sys::llm_grammar_compile_regex)
    }

    fn compile(
        model: &Model,
        text: &str,
        params: &GrammarParams,
        compiler: Compiler,
    ) -> Result<Grammar> {
        let root = match &params.root {
            Some(root) => Some(c_string(root, "the root rule")?),
            None => None,
        };
        let mut raw: sys::llm_grammar_params = unsafe { std::mem::zeroed() };
        unsafe {
            sys::llm_grammar_params_init_sized(
                &mut raw,
                std::mem::size_of::<sys::llm_grammar_params>(),
            )
        };
        raw.whitespace = match params.whitespace {
            GrammarWhitespace::Compact => sys::LLM_GRAMMAR_WS_COMPACT,
            GrammarWhitespace::Flexible => sys::LLM_GRAMMAR_WS_FLEXIBLE,
        };
        if let Some(root) = &root {
            raw.root = root.as_ptr();
        }
        let mut out: *mut sys::llm_grammar = std::ptr::null_mut();
        // The text goes with its length: it need not be NUL-terminated.
        check(unsafe {
            compiler(
                model.as_ptr(),
                text.as_ptr() as *const c_char,
                text.len(),
                &raw,
                &mut out,
            )
        })?;
        Ok(Grammar {
            raw: Arc::new(RawGrammar {
                ptr: out,
                _model: model.clone(),
            }),
        })
    }

    /// The C handle, valid while this grammar (or a clone) lives.
    pub fn as_ptr(&self) -> *const sys::llm_grammar {
        self.raw.ptr
    }
}
