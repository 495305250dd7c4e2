//! Sessions: blocking generation, requests, events and interrupts.

use crate::adapter::{Loans, RequestLoan};
use crate::error::{c_text, Error, Result};
use crate::model::{buffer_text, Model, Token};
use crate::params::{spec_mode_raw, FinishReason, GenerateParams, RawRequest, RawSampling};
use crate::params::{RequestParams, SessionParams};
use llminfer_sys as sys;
use std::any::Any;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};

/// Where a session runs (`llm_device_params`, experimental in llm.h), for
/// [`Session::new_on`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceParams {
    /// `"cpu"` (or empty), `"cuda"`, or `"auto"`: the first available
    /// backend other than the CPU, else the CPU.
    pub backend: String,
    /// Ranks the model is split across (0 or 1: none): CPU threads, or
    /// GPUs with `"cuda"`.
    pub tensor_parallel: u32,
    /// Device ids, `tensor_parallel` of them; empty: 0, or 0 .. n-1.
    pub devices: Vec<i32>,
}

/// Identifies a request within its session; never 0, never reused.
pub type RequestId = u64;

/// Events fetched per llm_session_step() call; more wait in the library.
const EVENT_BATCH: usize = 64;

pub(crate) struct RawSession(pub(crate) *mut sys::llm_session);

// The pointer is only used under the lock below, and only for the calls
// llm.h documents as thread-safe from several threads (see SessionHandle).
unsafe impl Send for RawSession {}
unsafe impl Sync for RawSession {}

/// What a session and its handles share. Closing takes the write lock, so
/// it waits for a submit, cancel or interrupt running on another thread,
/// and those then find the session closed instead of freed memory.
pub(crate) struct Shared {
    raw: RwLock<RawSession>,
    // Declared after `raw`: what the native session borrows outlives it.
    loans: Mutex<Loans>,
    pub(crate) _model: Model,
    _draft: Option<Model>,
}

impl Shared {
    pub(crate) fn lock(&self) -> Result<RwLockReadGuard<'_, RawSession>> {
        let guard = self
            .raw
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if guard.0.is_null() {
            Err(Error::closed("session"))
        } else {
            Ok(guard)
        }
    }

    fn close(&self) {
        let mut guard = self
            .raw
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !guard.0.is_null() {
            unsafe { sys::llm_session_free(guard.0) };
            guard.0 = std::ptr::null_mut();
            self.loans().clear();
        }
    }

    /// Adapters and grammars the session's requests and sequences borrow.
    pub(crate) fn loans(&self) -> MutexGuard<'_, Loans> {
        self.loans
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn submit(&self, prompt: &[Token], params: &RequestParams) -> Result<RequestId> {
        let request = RawRequest::new(params)?;
        let guard = self.lock()?;
        // Held across the submit, so that a step on another thread cannot
        // settle the request's loan before it is made.
        let mut loans = self.loans();
        let mut id: RequestId = 0;
        let status = unsafe {
            sys::llm_session_submit(
                guard.0,
                prompt.as_ptr(),
                prompt.len(),
                &request.raw,
                &mut id,
            )
        };
        check_session(guard.0, status)?;
        loans.lend_request(
            id,
            RequestLoan {
                adapter: params.adapter.clone(),
                grammar: params.sampling.as_ref().and_then(|s| s.grammar.clone()),
                finishes_due: params.samples(),
            },
        );
        Ok(id)
    }

    fn cancel(&self, id: RequestId) -> Result<()> {
        let guard = self.lock()?;
        check_session(guard.0, unsafe { sys::llm_session_cancel(guard.0, id) })
    }

    fn interrupt(&self) {
        if let Ok(guard) = self.lock() {
            unsafe { sys::llm_session_interrupt(guard.0) }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.close();
    }
}

/// The message of a failed call on `session`. Rust never moves a call to
/// another thread, so this thread's message belongs to exactly this call
/// even when other threads fail on the same session at the same time; the
/// session's own record is the fallback.
pub(crate) fn check_session(session: *mut sys::llm_session, status: sys::llm_status) -> Result<()> {
    if status == sys::LLM_OK {
        return Ok(());
    }
    let mut message = unsafe { c_text(sys::llm_last_error()) };
    if message.is_empty() {
        if let Some(recorded) = session_last_error(session) {
            if recorded.status.code() == status {
                message = recorded.message;
            }
        }
    }
    Err(Error::from_code(status, message))
}

fn session_last_error(session: *mut sys::llm_session) -> Option<Error> {
    let mut buf = vec![0u8; 256];
    for _ in 0..3 {
        let mut status = sys::LLM_OK;
        let mut needed = 0usize;
        let rc = unsafe {
            sys::llm_session_last_error(
                session,
                &mut status,
                buf.as_mut_ptr() as *mut c_char,
                buf.len(),
                &mut needed,
            )
        };
        if rc != sys::LLM_OK || status == sys::LLM_OK {
            return None;
        }
        if needed > buf.len() {
            buf.resize(needed, 0);
            continue;
        }
        return Some(Error::from_code(status, buffer_text(&buf)));
    }
    None
}

/// One thing that happened to a request during a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub request: RequestId,
    /// The new token; `None` on a finish-only event.
    pub token: Option<Token>,
    /// The text this event completes (whole UTF-8 characters; may be empty).
    pub text: String,
    /// log p(token) when requested, else 0.
    pub logprob: f32,
    /// Set on the last event of a request (of a sample, with several).
    pub finish: Option<FinishReason>,
    /// Why, when `finish` is [`FinishReason::Error`].
    pub error: Option<Error>,
    /// With `top_logprobs`: the most likely tokens and their log-probabilities.
    pub top: Vec<(Token, f32)>,
    pub sample_index: u32,
}

impl Event {
    /// Copies an event out of the library's memory, which the next step reuses.
    unsafe fn from_raw(raw: &sys::llm_event) -> Event {
        let text = if raw.text.is_null() || raw.text_len == 0 {
            String::new()
        } else {
            let bytes = std::slice::from_raw_parts(raw.text as *const u8, raw.text_len);
            String::from_utf8_lossy(bytes).into_owned()
        };
        let mut top = Vec::new();
        if !raw.top_tokens.is_null() && !raw.top_logprobs.is_null() {
            let n = raw.n_top as usize;
            let tokens = std::slice::from_raw_parts(raw.top_tokens, n);
            let logprobs = std::slice::from_raw_parts(raw.top_logprobs, n);
            top = tokens
                .iter()
                .copied()
                .zip(logprobs.iter().copied())
                .collect();
        }
        let finish = FinishReason::from_raw(raw.finish_reason);
        let error = if finish == Some(FinishReason::Error) && raw.status != sys::LLM_OK {
            Some(Error::from_code(raw.status, String::new()))
        } else {
            None
        };
        Event {
            request: raw.request,
            token: if raw.token == sys::LLM_TOKEN_NONE {
                None
            } else {
                Some(raw.token)
            },
            text,
            logprob: raw.logprob,
            finish,
            error,
            top,
            sample_index: raw.sample_index,
        }
    }
}

/// What one [`Session::generate`] call did.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateResult {
    pub finish_reason: Option<FinishReason>,
    pub n_prompt_tokens: u32,
    pub n_generated_tokens: u32,
    pub prompt_seconds: f64,
    pub generate_seconds: f64,
    pub n_spec_steps: u32,
    pub n_draft_tokens: u32,
    pub n_accepted_tokens: u32,
}

/// A finished blocking generation: its tokens, their text and the counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<Token>,
    pub text: String,
    pub result: GenerateResult,
}

/// Counters and gauges of a session (see `llm_session_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
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

/// The array llm_session_step() writes into. Its pointers are only read
/// right after the step that wrote them, by the stepping thread.
struct EventBuffer(Vec<sys::llm_event>);

unsafe impl Send for EventBuffer {}

struct TokenSink<'a> {
    callback: &'a mut dyn FnMut(Option<Token>, &str) -> bool,
    panic: Option<Box<dyn Any + Send + 'static>>,
}

/// Runs the Rust callback for C; a panic is caught here (it must not unwind
/// through the library), stops generation and is resumed after the call.
unsafe extern "C" fn on_token(
    token: sys::llm_token,
    piece: *const c_char,
    piece_len: usize,
    user: *mut c_void,
) -> bool {
    let sink = &mut *(user as *mut TokenSink);
    if sink.panic.is_some() {
        return false;
    }
    let bytes = if piece.is_null() || piece_len == 0 {
        &[][..]
    } else {
        std::slice::from_raw_parts(piece as *const u8, piece_len)
    };
    let text = String::from_utf8_lossy(bytes);
    let token = if token == sys::LLM_TOKEN_NONE {
        None
    } else {
        Some(token)
    };
    let callback = &mut sink.callback;
    match catch_unwind(AssertUnwindSafe(|| callback(token, &text))) {
        Ok(go_on) => go_on,
        Err(payload) => {
            sink.panic = Some(payload);
            false
        }
    }
}

/// A runtime for one model: KV memory, threads and requests. One thread
/// steps it (`Send`, not `Sync`); other threads submit, cancel and
/// interrupt through a [`SessionHandle`].
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<llminfer::Session>();
/// ```
pub struct Session {
    pub(crate) shared: Arc<Shared>,
    events: EventBuffer,
    /// Events of other requests that a stream (stream.rs) stepped past.
    pub(crate) pending: VecDeque<Event>,
    /// Requests whose stream was dropped early: their remaining events are
    /// swallowed; the value counts the finish events still to come.
    pub(crate) discarded: HashMap<RequestId, u32>,
    _not_sync: PhantomData<Cell<()>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Session {
    pub fn new(model: &Model, params: &SessionParams) -> Result<Session> {
        Session::create(model, params, None)
    }

    /// A session on the backend, ranks and devices `device` names
    /// (`llm_session_create_ex`, experimental in llm.h). A backend that is
    /// not available here is an error saying why.
    pub fn new_on(model: &Model, params: &SessionParams, device: &DeviceParams) -> Result<Session> {
        Session::create(model, params, Some(device))
    }

    fn create(
        model: &Model,
        params: &SessionParams,
        device: Option<&DeviceParams>,
    ) -> Result<Session> {
        let mut message = vec![0u8; 1024];
        let mut raw = params.to_raw();
        raw.error_message = message.as_mut_ptr() as *mut c_char;
        raw.error_capacity = message.len();
        let mut out: *mut sys::llm_session = std::ptr::null_mut();
        let status = match device {
            None => unsafe { sys::llm_session_create(model.as_ptr(), &raw, &mut out) },
            Some(device) => {
                let backend = crate::error::c_string(&device.backend, "backend name")?;
                let mut where_: sys::llm_device_params = unsafe { std::mem::zeroed() };
                unsafe {
                    sys::llm_device_params_init_sized(
                        &mut where_,
                        std::mem::size_of::<sys::llm_device_params>(),
                    )
                };
                if !device.backend.is_empty() {
                    where_.backend = backend.as_ptr();
                }
                where_.tensor_parallel = device.tensor_parallel.max(1);
                if !device.devices.is_empty() {
                    where_.devices = device.devices.as_ptr();
                    where_.n_devices = device.devices.len() as u32;
                }
                unsafe { sys::llm_session_create_ex(model.as_ptr(), &raw, &where_, &mut out) }
            }
        };
        if status != sys::LLM_OK {
            return Err(Error::from_code(status, buffer_text(&message)));
        }
        let empty: sys::llm_event = unsafe { std::mem::zeroed() };
        Ok(Session {
            shared: Arc::new(Shared {
                raw: RwLock::new(RawSession(out)),
                loans: Mutex::new(Loans::default()),
                _model: model.clone(),
                _draft: params.draft_model.clone(),
            }),
            events: EventBuffer(vec![empty; EVENT_BATCH]),
            pending: VecDeque::new(),
            discarded: HashMap::new(),
            _not_sync: PhantomData,
        })
    }

    /// Frees the native session now. Closing again does nothing; calls
    /// after it (here or through a handle) give an error.
    pub fn close(&mut self) {
        self.shared.close();
        self.pending.clear();
        self.discarded.clear();
    }

    pub fn is_closed(&self) -> bool {
        self.shared.lock().is_err()
    }

    /// A handle for other threads: submit, cancel and interrupt.
    pub fn handle(&self) -> SessionHandle {
        SessionHandle {
            shared: self.shared.clone(),
        }
    }

    /// The C handle (null once closed), for calls this crate does not wrap.
    /// Valid until [`close`](Session::close) or drop.
    pub fn as_ptr(&self) -> *mut sys::llm_session {
        self.shared
            .lock()
            .map(|g| g.0)
            .unwrap_or(std::ptr::null_mut())
    }

    /// Queues a request; its events come from [`step`](Session::step).
    pub fn submit(&self, prompt: &[Token], params: &RequestParams) -> Result<RequestId> {
        self.shared.submit(prompt, params)
    }

    /// Cancels a request; its finish event ([`FinishReason::Cancelled`])
    /// comes with a later step.
    pub fn cancel(&self, id: RequestId) -> Result<()> {
        self.shared.cancel(id)
    }

    /// Stops the generate or step now running (see [`SessionHandle::interrupt`]).
    pub fn interrupt(&self) {
        self.shared.interrupt()
    }

    /// Runs one scheduler iteration (or delivers events still queued) and
    /// returns its events. An empty list does not by itself mean the
    /// session is idle (a prompt chunk yields no token): see [`is_idle`](Session::is_idle).
    pub fn step(&mut self) -> Result<Vec<Event>> {
        if !self.pending.is_empty() {
            return Ok(self.pending.drain(..).collect());
        }
        self.step_native()
    }

    pub(crate) fn step_native(&mut self) -> Result<Vec<Event>> {
        let guard = self.shared.lock()?;
        let mut n = 0usize;
        let status = unsafe {
            sys::llm_session_step(
                guard.0,
                self.events.0.as_mut_ptr(),
                self.events.0.len(),
                std::mem::size_of::<sys::llm_event>(),
                &mut n,
            )
        };
        check_session(guard.0, status)?;
        let mut out = Vec::with_capacity(n);
        let mut loans = self.shared.loans();
        for raw in &self.events.0[..n.min(self.events.0.len())] {
            if raw.finish_reason != sys::LLM_FINISH_NONE {
                loans.finished(raw.request);
            }
            if let Some(left) = self.discarded.get_mut(&raw.request) {
                if raw.finish_reason != sys::LLM_FINISH_NONE {
                    *left = left.saturating_sub(1);
                    if *left == 0 {
                        self.discarded.remove(&raw.request);
                    }
                }
                continue;
            }
            out.push(unsafe { Event::from_raw(raw) });
        }
        Ok(out)
    }

    /// True when no request is running or waiting and no event is queued.
    pub fn is_idle(&self) -> Result<bool> {
        let stats = self.stats()?;
        Ok(self.pending.is_empty() && stats.n_running == 0 && stats.n_waiting == 0)
    }

    /// Blocking generation, collecting the tokens and their text.
    pub fn generate(&mut self, prompt: &[Token], params: &GenerateParams) -> Result<Generation> {
        let mut tokens = Vec::new();
        let mut text = String::new();
        let result = self.generate_with(prompt, params, |token, piece| {
            if let Some(token) = token {
                tokens.push(token);
            }
            text.push_str(piece);
            true
        })?;
        Ok(Generation {
            tokens,
            text,
            result,
        })
    }

    /// Blocking generation calling `on_token(token, text)` per token (with
    /// `None` for a last piece of held-back bytes); return false to stop.
    /// A panic in `on_token` stops generation and is resumed here.
    pub fn generate_with<F>(
        &mut self,
        prompt: &[Token],
        params: &GenerateParams,
        mut on_token_fn: F,
    ) -> Result<GenerateResult>
    where
        F: FnMut(Option<Token>, &str) -> bool,
    {
        let sampling = params.sampling.as_ref().map(RawSampling::new);
        let mut sink = TokenSink {
            callback: &mut on_token_fn,
            panic: None,
        };
        let mut raw = GenerateParams::raw_defaults();
        raw.max_new_tokens = params.max_new_tokens;
        raw.sampling = RawSampling::ptr(&sampling);
        raw.on_token = Some(on_token);
        raw.user = &mut sink as *mut TokenSink as *mut c_void;
        raw.ignore_eos = params.ignore_eos;
        raw.spec_mode = spec_mode_raw(params.spec_mode);
        raw.spec_k = params.spec_k;
        // `params` (and so the adapter and grammar) outlives the call.
        raw.adapter = params
            .adapter
            .as_ref()
            .map_or(std::ptr::null(), |a| a.as_ptr());
        raw.adapter_scale = params.adapter_scale;
        let mut result: sys::llm_generate_result = unsafe { std::mem::zeroed() };
        result.struct_size = std::mem::size_of::<sys::llm_generate_result>() as u32;
        let status = {
            let guard = self.shared.lock()?;
            let status = unsafe {
                sys::llm_generate(guard.0, prompt.as_ptr(), prompt.len(), &raw, &mut result)
            };
            check_session(guard.0, status)
        };
        if let Some(payload) = sink.panic.take() {
            resume_unwind(payload);
        }
        status?;
        Ok(GenerateResult {
            finish_reason: FinishReason::from_raw(result.finish_reason),
            n_prompt_tokens: result.n_prompt_tokens,
            n_generated_tokens: result.n_generated_tokens,
            prompt_seconds: result.prompt_seconds,
            generate_seconds: result.generate_seconds,
            n_spec_steps: result.n_spec_steps,
            n_draft_tokens: result.n_draft_tokens,
            n_accepted_tokens: result.n_accepted_tokens,
        })
    }

    pub fn stats(&self) -> Result<SessionStats> {
        let guard = self.shared.lock()?;
        let mut raw: sys::llm_session_stats = unsafe { std::mem::zeroed() };
        raw.struct_size = std::mem::size_of::<sys::llm_session_stats>() as u32;
        check_session(guard.0, unsafe {
            sys::llm_session_get_stats(guard.0, &mut raw)
        })?;
        Ok(SessionStats {
            n_running: raw.n_running,
            n_waiting: raw.n_waiting,
            block_size: raw.block_size,
            blocks_total: raw.blocks_total,
            blocks_used: raw.blocks_used,
            blocks_cached: raw.blocks_cached,
            blocks_free: raw.blocks_free,
            kv_tokens_used: raw.kv_tokens_used,
            prefix_hit_tokens: raw.prefix_hit_tokens,
            prompt_tokens: raw.prompt_tokens,
            generated_tokens: raw.generated_tokens,
            preemptions: raw.preemptions,
            steps: raw.steps,
            spec_steps: raw.spec_steps,
            spec_draft_tokens: raw.spec_draft_tokens,
            spec_accepted_tokens: raw.spec_accepted_tokens,
        })
    }

    /// The session's last recorded failure (from any thread), if any.
    pub fn last_error(&self) -> Option<Error> {
        let guard = self.shared.lock().ok()?;
        session_last_error(guard.0)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
    }
}

/// The part of a session other threads may use while one thread steps it:
/// exactly the calls llm.h documents as thread-safe (submit, cancel,
/// interrupt). After the session is closed they give an error (interrupt
/// does nothing).
#[derive(Clone)]
pub struct SessionHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle").finish()
    }
}

impl SessionHandle {
    pub fn submit(&self, prompt: &[Token], params: &RequestParams) -> Result<RequestId> {
        self.shared.submit(prompt, params)
    }

    pub fn cancel(&self, id: RequestId) -> Result<()> {
        self.shared.cancel(id)
    }

    /// Asks the generate or step now running to stop soon with
    /// [`Status::Cancelled`](crate::Status::Cancelled); nothing is lost (a step may simply be
    /// repeated). No effect when none runs.
    pub fn interrupt(&self) {
        self.shared.interrupt()
    }

    pub fn is_closed(&self) -> bool {
        self.shared.lock().is_err()
    }
}

#[allow(dead_code)]
fn assert_thread_traits() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Model>();
    sync::<Model>();
    send::<Session>();
    send::<SessionHandle>();
    sync::<SessionHandle>();
}
