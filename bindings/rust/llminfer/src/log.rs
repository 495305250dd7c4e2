//! The library's process-wide log sink, routed to a Rust closure.

use llminfer_sys as sys;
use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// Severity of a library message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    fn to_raw(self) -> sys::llm_log_level {
        match self {
            LogLevel::Debug => sys::LLM_LOG_DEBUG,
            LogLevel::Info => sys::LLM_LOG_INFO,
            LogLevel::Warn => sys::LLM_LOG_WARN,
            LogLevel::Error => sys::LLM_LOG_ERROR,
        }
    }

    fn from_raw(raw: sys::llm_log_level) -> LogLevel {
        match raw {
            sys::LLM_LOG_DEBUG => LogLevel::Debug,
            sys::LLM_LOG_INFO => LogLevel::Info,
            sys::LLM_LOG_WARN => LogLevel::Warn,
            _ => LogLevel::Error,
        }
    }
}

type Sink = Box<dyn Fn(LogLevel, &str) + Send + Sync + 'static>;

/// The installed sink's address (a leaked `Box<Sink>`), 0 for none. The
/// lock orders concurrent `set_log_sink` calls, so the sink freed is always
/// the one the library just stopped calling.
static INSTALLED: Mutex<usize> = Mutex::new(0);

unsafe extern "C" fn forward(level: sys::llm_log_level, message: *const c_char, user: *mut c_void) {
    if user.is_null() || message.is_null() {
        return;
    }
    let sink = &*(user as *const Sink);
    let text = CStr::from_ptr(message).to_string_lossy();
    // A panicking sink loses its message; it must not unwind into C.
    let _ = catch_unwind(AssertUnwindSafe(|| sink(LogLevel::from_raw(level), &text)));
}

/// Sends the library's messages at `min_level` and above to `sink`, from
/// whatever thread logs them (one call at a time). Replaces the sink
/// before; the library is silent until one is set.
pub fn set_log_sink<F>(min_level: LogLevel, sink: F)
where
    F: Fn(LogLevel, &str) + Send + Sync + 'static,
{
    let boxed: Box<Sink> = Box::new(Box::new(sink));
    install(Some(forward), min_level, Box::into_raw(boxed) as usize);
}

/// Silences the library again.
pub fn clear_log_sink() {
    install(None, LogLevel::Error, 0);
}

fn install(f: sys::llm_log_fn, min_level: LogLevel, user: usize) {
    let mut installed = INSTALLED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // When llm_log_set returns, no call of the old sink runs or will start.
    unsafe { sys::llm_log_set(f, min_level.to_raw(), user as *mut c_void) };
    let old = std::mem::replace(&mut *installed, user);
    if old != 0 {
        drop(unsafe { Box::from_raw(old as *mut Sink) });
    }
}
