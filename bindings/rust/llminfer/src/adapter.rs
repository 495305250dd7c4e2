//! LoRA adapters (API 1.4; docs/lora.md) and what a session keeps alive
//! for the library while its requests and sequences borrow them.

use crate::error::{check, Result};
use crate::grammar::Grammar;
use crate::model::{path_to_c, Model};
use crate::session::{check_session, RequestId, Session};
use crate::tokens::SeqId;
use llminfer_sys as sys;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Options of [`Adapter::load_with`]; `Default` gives the library's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterParams {
    /// Map a GGUF adapter instead of reading it while loading.
    pub use_mmap: bool,
}

impl Default for AdapterParams {
    fn default() -> Self {
        AdapterParams { use_mmap: true }
    }
}

struct RawAdapter {
    ptr: *mut sys::llm_adapter,
    // Dropped after the adapter is freed: the adapter borrows its model.
    _model: Model,
}

// llm.h: a loaded adapter is immutable and thread-safe to share across
// sessions and requests.
unsafe impl Send for RawAdapter {}
unsafe impl Sync for RawAdapter {}

impl Drop for RawAdapter {
    fn drop(&mut self) {
        unsafe { sys::llm_adapter_free(self.ptr) }
    }
}

/// A LoRA adapter loaded for one model: a llama.cpp LoRA GGUF file or a
/// Hugging Face PEFT folder. Cloning is cheap (shared). It keeps its model
/// alive, and every request and sequence that uses it keeps it alive until
/// the request finishes or the sequence closes (or its session closes), so
/// dropping the last clone in the program never frees an adapter the
/// library still reads.
#[derive(Clone)]
pub struct Adapter {
    raw: Arc<RawAdapter>,
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("ptr", &self.raw.ptr)
            .finish()
    }
}

/// The same loaded adapter (not: the same file).
impl PartialEq for Adapter {
    fn eq(&self, other: &Adapter) -> bool {
        Arc::ptr_eq(&self.raw, &other.raw)
    }
}

impl Adapter {
    /// Loads an adapter for `model` with default options.
    pub fn load<P: AsRef<Path>>(model: &Model, path: P) -> Result<Adapter> {
        Adapter::load_with(model, path, &AdapterParams::default())
    }

    /// Loads an adapter for `model` (`llm_adapter_load`). A missing file is
    /// [`Status::Io`](crate::Status::Io), a file that is not an adapter or
    /// whose shapes disagree with the model's [`Status::BadFormat`](crate::Status::BadFormat),
    /// an adapter of another architecture or beyond a plain LoRA
    /// [`Status::Unsupported`](crate::Status::Unsupported); the message
    /// names the file, tensor or field.
    pub fn load_with<P: AsRef<Path>>(
        model: &Model,
        path: P,
        params: &AdapterParams,
    ) -> Result<Adapter> {
        let cpath = path_to_c(path.as_ref())?;
        let mut raw: sys::llm_adapter_params = unsafe { std::mem::zeroed() };
        unsafe {
            sys::llm_adapter_params_init_sized(
                &mut raw,
                std::mem::size_of::<sys::llm_adapter_params>(),
            )
        };
        raw.use_mmap = params.use_mmap;
        let mut out: *mut sys::llm_adapter = std::ptr::null_mut();
        check(unsafe { sys::llm_adapter_load(model.as_ptr(), cpath.as_ptr(), &raw, &mut out) })?;
        Ok(Adapter {
            raw: Arc::new(RawAdapter {
                ptr: out,
                _model: model.clone(),
            }),
        })
    }

    /// The C handle, valid while this adapter (or a clone) lives.
    pub fn as_ptr(&self) -> *const sys::llm_adapter {
        self.raw.ptr
    }

    /// The model the adapter was loaded for.
    pub fn model(&self) -> &Model {
        &self.raw._model
    }
}

/// What the library borrows from one request until its last sample ends.
pub(crate) struct RequestLoan {
    pub adapter: Option<Adapter>,
    pub grammar: Option<Grammar>,
    pub finishes_due: u32,
}

/// Adapters and grammars a session's requests and sequences use now.
#[derive(Default)]
pub(crate) struct Loans {
    requests: HashMap<RequestId, RequestLoan>,
    sequences: HashMap<SeqId, Adapter>,
}

impl Loans {
    pub fn lend_request(&mut self, id: RequestId, loan: RequestLoan) {
        if loan.adapter.is_some() || loan.grammar.is_some() {
            self.requests.insert(id, loan);
        }
    }

    /// Called for every event a step delivers: a request's last finish
    /// gives back what it borrowed.
    pub fn finished(&mut self, id: RequestId) {
        let done = match self.requests.get_mut(&id) {
            Some(loan) => {
                loan.finishes_due = loan.finishes_due.saturating_sub(1);
                loan.finishes_due == 0
            }
            None => false,
        };
        if done {
            self.requests.remove(&id);
        }
    }

    pub fn set_sequence(&mut self, seq: SeqId, adapter: Option<Adapter>) {
        match adapter {
            Some(adapter) => {
                self.sequences.insert(seq, adapter);
            }
            None => {
                self.sequences.remove(&seq);
            }
        }
    }

    pub fn fork_sequence(&mut self, src: SeqId, fork: SeqId) {
        if let Some(adapter) = self.sequences.get(&src).cloned() {
            self.sequences.insert(fork, adapter);
        }
    }

    /// How many requests and sequences hold `adapter` now.
    pub fn uses(&self, adapter: &Adapter) -> usize {
        let requests = self
            .requests
            .values()
            .filter(|loan| loan.adapter.as_ref() == Some(adapter))
            .count();
        requests + self.sequences.values().filter(|a| *a == adapter).count()
    }

    pub fn clear(&mut self) {
        self.requests.clear();
        self.sequences.clear();
    }
}

impl Session {
    /// Runs the token-level sequence `seq` with `adapter` (one loaded for
    /// this session's model) at `scale`, which multiplies its alpha / rank,
    /// or on the base model with `None` (`llm_seq_set_adapter`). Only while
    /// the sequence holds no tokens, or to give a sequence restored from a
    /// state saved under an adapter the same adapter (another load of the
    /// same file) and scale; [`Status::InvalidArgument`](crate::Status::InvalidArgument)
    /// otherwise. Forks keep their source's adapter. The session keeps the
    /// adapter alive until the sequence closes or gets another one.
    pub fn seq_set_adapter(
        &mut self,
        seq: SeqId,
        adapter: Option<&Adapter>,
        scale: f32,
    ) -> Result<()> {
        let guard = self.shared.lock()?;
        let handle = adapter.map_or(std::ptr::null(), |a| a.as_ptr());
        let status = unsafe { sys::llm_seq_set_adapter(guard.0, seq, handle, scale) };
        check_session(guard.0, status)?;
        self.shared.loans().set_sequence(seq, adapter.cloned());
        Ok(())
    }

    /// How many of this session's running requests and open sequences use
    /// `adapter` (the library borrows it from each).
    pub fn adapter_uses(&self, adapter: &Adapter) -> usize {
        self.shared.loans().uses(adapter)
    }
}
