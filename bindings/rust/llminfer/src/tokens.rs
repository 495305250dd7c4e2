//! Token level: sequences the host decodes itself (`llm_seq_*`,
//! `llm_batch`, `llm_session_decode`, `llm_session_logits`), their saved
//! state, and the standalone sampler (`llm_sampler`). As in llm.h, none of
//! this is thread-safe: the methods take the session by `&mut` where they
//! change it.

use crate::error::{Error, Result};
use crate::grammar::Grammar;
use crate::model::{Model, Token};
use crate::params::{RawSampling, SamplingParams};
use crate::session::{check_session, Session};
use llminfer_sys as sys;
use std::os::raw::c_void;

/// A token-level sequence of a session (`llm_seq_id`).
pub type SeqId = i32;

/// One step's rows (sequence, position, token, want logits): `llm_batch`.
pub struct Batch {
    ptr: *mut sys::llm_batch,
    rows: u32,
    capacity: u32,
}

impl Batch {
    /// A batch of up to `capacity` rows.
    pub fn new(capacity: u32) -> Result<Batch> {
        let mut ptr = std::ptr::null_mut();
        crate::error::check(unsafe { sys::llm_batch_create(capacity, &mut ptr) })?;
        Ok(Batch {
            ptr,
            rows: 0,
            capacity,
        })
    }

    /// Appends a row; a sequence's rows continue at its length (llm.h).
    /// `Status::Limit` when the batch is full.
    pub fn add(&mut self, seq: SeqId, pos: u32, token: Token, want_logits: bool) -> Result<u32> {
        crate::error::check(unsafe { sys::llm_batch_add(self.ptr, seq, pos, token, want_logits) })?;
        self.rows += 1;
        Ok(self.rows - 1)
    }

    /// Appends `tokens` to `seq` from position `pos`, logits for the last.
    pub fn add_sequence(&mut self, seq: SeqId, pos: u32, tokens: &[Token]) -> Result<()> {
        for (i, &token) in tokens.iter().enumerate() {
            self.add(seq, pos + i as u32, token, i + 1 == tokens.len())?;
        }
        Ok(())
    }

    pub fn clear(&mut self) {
        unsafe { sys::llm_batch_clear(self.ptr) };
        self.rows = 0;
    }

    pub fn len(&self) -> u32 {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        unsafe { sys::llm_batch_free(self.ptr) };
    }
}

/// Reads a variable-size state through a save call of llm.h's
/// "too small: here is the size" shape.
fn save_bytes<F>(mut save: F) -> Result<Vec<u8>>
where
    F: FnMut(*mut c_void, usize, &mut usize) -> sys::llm_status,
{
    let mut size = 0usize;
    let status = save(std::ptr::null_mut(), 0, &mut size);
    if status != sys::LLM_ERR_BUFFER_TOO_SMALL && status != sys::LLM_OK {
        crate::error::check(status)?;
    }
    let mut buf = vec![0u8; size.max(1)];
    let status = save(buf.as_mut_ptr() as *mut c_void, buf.len(), &mut size);
    crate::error::check(status)?;
    buf.truncate(size);
    Ok(buf)
}

impl Session {
    fn raw_call<T>(
        &self,
        f: impl FnOnce(*mut sys::llm_session) -> (sys::llm_status, T),
    ) -> Result<T> {
        let guard = self.shared.lock()?;
        let (status, value) = f(guard.0);
        check_session(guard.0, status)?;
        Ok(value)
    }

    /// Opens an empty sequence (`llm_seq_open`).
    pub fn seq_open(&mut self) -> Result<SeqId> {
        self.raw_call(|s| {
            let mut id = -1;
            (unsafe { sys::llm_seq_open(s, &mut id) }, id)
        })
    }

    /// A new sequence sharing `src`'s KV blocks, copy-on-write (`llm_seq_fork`).
    /// The fork keeps `src`'s LoRA adapter.
    pub fn seq_fork(&mut self, src: SeqId) -> Result<SeqId> {
        let fork = self.raw_call(|s| {
            let mut id = -1;
            (unsafe { sys::llm_seq_fork(s, src, &mut id) }, id)
        })?;
        self.shared.loans().fork_sequence(src, fork);
        Ok(fork)
    }

    pub fn seq_close(&mut self, seq: SeqId) -> Result<()> {
        self.raw_call(|s| (unsafe { sys::llm_seq_close(s, seq) }, ()))?;
        self.shared.loans().set_sequence(seq, None);
        Ok(())
    }

    /// Forgets positions from `n_tokens` on.
    pub fn seq_truncate(&mut self, seq: SeqId, n_tokens: u32) -> Result<()> {
        self.raw_call(|s| (unsafe { sys::llm_seq_truncate(s, seq, n_tokens) }, ()))
    }

    /// How many positions the sequence holds.
    pub fn seq_len(&self, seq: SeqId) -> Result<u32> {
        self.raw_call(|s| {
            let mut n = 0u32;
            (unsafe { sys::llm_seq_length(s, seq, &mut n) }, n)
        })
    }

    /// The tokens the sequence holds (`llm_seq_tokens`).
    pub fn seq_tokens(&self, seq: SeqId) -> Result<Vec<Token>> {
        let n = self.seq_len(seq)? as usize;
        let mut tokens: Vec<Token> = vec![0; n.max(1)];
        let got = self.raw_call(|s| {
            let mut got = 0usize;
            let status =
                unsafe { sys::llm_seq_tokens(s, seq, tokens.as_mut_ptr(), tokens.len(), &mut got) };
            (status, got)
        })?;
        tokens.truncate(got);
        Ok(tokens)
    }

    /// Computes every row of `batch` in one forward pass, all or nothing
    /// (`llm_session_decode`).
    pub fn decode(&mut self, batch: &Batch) -> Result<()> {
        self.raw_call(|s| (unsafe { sys::llm_session_decode(s, batch.ptr) }, ()))
    }

    /// A copy of the logits (n_vocab) of row `row` of the last decode,
    /// which must have asked for them.
    pub fn logits(&self, row: u32) -> Result<Vec<f32>> {
        let n_vocab = self.shared._model.info()?.n_vocab as usize;
        self.raw_call(|s| {
            let mut ptr: *const f32 = std::ptr::null();
            let status = unsafe { sys::llm_session_logits(s, row, &mut ptr) };
            let copy = if status == sys::LLM_OK && !ptr.is_null() {
                unsafe { std::slice::from_raw_parts(ptr, n_vocab) }.to_vec()
            } else {
                Vec::new()
            };
            (status, copy)
        })
    }

    /// The sequence's state: its tokens and K/V (`llm_seq_state_save`).
    pub fn seq_state_save(&self, seq: SeqId) -> Result<Vec<u8>> {
        let guard = self.shared.lock()?;
        let s = guard.0;
        save_bytes(|buf, cap, size| unsafe { sys::llm_seq_state_save(s, seq, buf, cap, size) })
    }

    /// Opens a new sequence from a state of [`seq_state_save`](Session::seq_state_save),
    /// here or in another session on the same model (`llm_seq_state_load`).
    pub fn seq_state_load(&mut self, data: &[u8]) -> Result<SeqId> {
        self.raw_call(|s| {
            let mut id = -1;
            let status = unsafe {
                sys::llm_seq_state_load(s, data.as_ptr() as *const c_void, data.len(), &mut id)
            };
            (status, id)
        })
    }

    /// Every open token-level sequence with its id (`llm_session_state_save`).
    pub fn state_save(&self) -> Result<Vec<u8>> {
        let guard = self.shared.lock()?;
        let s = guard.0;
        save_bytes(|buf, cap, size| unsafe { sys::llm_session_state_save(s, buf, cap, size) })
    }

    /// Re-creates the sequences of a [`state_save`](Session::state_save)
    /// under their ids; the session must have none open.
    pub fn state_load(&mut self, data: &[u8]) -> Result<()> {
        self.raw_call(|s| {
            let status = unsafe {
                sys::llm_session_state_load(s, data.as_ptr() as *const c_void, data.len())
            };
            (status, ())
        })
    }
}

/// The standalone sampler (`llm_sampler`): the library's sampling chain
/// on logits the host has, with a counter-based random stream.
pub struct Sampler {
    ptr: *mut sys::llm_sampler,
    n_vocab: usize,
    _model: Model,
    // The sampler's grammar state reads it while the sampler lives.
    _grammar: Option<Grammar>,
}

impl Sampler {
    /// A sampler for `model`'s vocabulary; `stream` keys its random numbers
    /// with the seed and the position.
    pub fn new(model: &Model, params: &SamplingParams, stream: u64) -> Result<Sampler> {
        let raw = RawSampling::new(params);
        let mut ptr = std::ptr::null_mut();
        crate::error::check(unsafe {
            sys::llm_sampler_create(model.as_ptr(), &*raw.raw, stream, &mut ptr)
        })?;
        Ok(Sampler {
            ptr,
            n_vocab: model.info()?.n_vocab as usize,
            _model: model.clone(),
            _grammar: params.grammar.clone(),
        })
    }

    /// Picks a token from `logits` (n_vocab of them); `history` holds the
    /// tokens so far (for penalties), `n_generated` how many of them were
    /// generated, `position` the index the token will take.
    pub fn sample(
        &mut self,
        logits: &[f32],
        history: &[Token],
        n_generated: u32,
        position: u64,
    ) -> Result<Token> {
        if logits.len() != self.n_vocab {
            return Err(Error::from_code(
                sys::LLM_ERR_INVALID_ARGUMENT,
                format!(
                    "{} logits for a vocabulary of {}",
                    logits.len(),
                    self.n_vocab
                ),
            ));
        }
        let mut token: Token = -1;
        crate::error::check(unsafe {
            sys::llm_sampler_sample(
                self.ptr,
                logits.as_ptr(),
                history.as_ptr(),
                history.len(),
                n_generated,
                position,
                &mut token,
            )
        })?;
        Ok(token)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        unsafe { sys::llm_sampler_free(self.ptr) };
    }
}
