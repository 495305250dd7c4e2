//! Errors: every non-OK status of the library, with its name and message.

use llminfer_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;

/// A library status other than success. `Other` keeps codes newer than
/// this crate, so no status is ever lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    OutOfMemory,
    Io,
    BadFormat,
    Unsupported,
    BufferTooSmall,
    Limit,
    InvalidUtf8,
    NotFound,
    Cancelled,
    Backend,
    Internal,
    Other(i32),
}

impl Status {
    pub fn from_code(code: i32) -> Status {
        match code {
            sys::LLM_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::LLM_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::LLM_ERR_IO => Status::Io,
            sys::LLM_ERR_BAD_FORMAT => Status::BadFormat,
            sys::LLM_ERR_UNSUPPORTED => Status::Unsupported,
            sys::LLM_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::LLM_ERR_LIMIT => Status::Limit,
            sys::LLM_ERR_INVALID_UTF8 => Status::InvalidUtf8,
            sys::LLM_ERR_NOT_FOUND => Status::NotFound,
            sys::LLM_ERR_CANCELLED => Status::Cancelled,
            sys::LLM_ERR_BACKEND => Status::Backend,
            sys::LLM_ERR_INTERNAL => Status::Internal,
            other => Status::Other(other),
        }
    }

    /// The C value (`llm_status`).
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::LLM_ERR_INVALID_ARGUMENT,
            Status::OutOfMemory => sys::LLM_ERR_OUT_OF_MEMORY,
            Status::Io => sys::LLM_ERR_IO,
            Status::BadFormat => sys::LLM_ERR_BAD_FORMAT,
            Status::Unsupported => sys::LLM_ERR_UNSUPPORTED,
            Status::BufferTooSmall => sys::LLM_ERR_BUFFER_TOO_SMALL,
            Status::Limit => sys::LLM_ERR_LIMIT,
            Status::InvalidUtf8 => sys::LLM_ERR_INVALID_UTF8,
            Status::NotFound => sys::LLM_ERR_NOT_FOUND,
            Status::Cancelled => sys::LLM_ERR_CANCELLED,
            Status::Backend => sys::LLM_ERR_BACKEND,
            Status::Internal => sys::LLM_ERR_INTERNAL,
            Status::Other(code) => code,
        }
    }

    /// The enumerator name from the library, e.g. `"LLM_ERR_IO"`.
    pub fn name(self) -> String {
        unsafe { c_text(sys::llm_status_name(self.code())) }
    }

    /// The library's short description, e.g. `"input/output error"`.
    pub fn description(self) -> String {
        unsafe { c_text(sys::llm_status_str(self.code())) }
    }
}

/// What a failed call returns: the status, its name and the library's
/// message for this failure (empty when it gave none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub status_name: String,
    pub message: String,
}

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            status_name: status.name(),
            message: message.into(),
        }
    }

    pub(crate) fn from_code(code: sys::llm_status, message: String) -> Error {
        Error::new(Status::from_code(code), message)
    }

    pub(crate) fn closed(what: &str) -> Error {
        Error::new(Status::InvalidArgument, format!("the {} is closed", what))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}: {}", self.status_name, self.status.description())
        } else {
            write!(f, "{}: {}", self.status_name, self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Copies a C string the library owns; NULL gives "".
pub(crate) unsafe fn c_text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    }
}

/// Turns a status into a Result, reading this thread's message at once:
/// the caller is still on the thread that made the failing call.
pub(crate) fn check(status: sys::llm_status) -> Result<()> {
    if status == sys::LLM_OK {
        Ok(())
    } else {
        Err(Error::from_code(status, unsafe {
            c_text(sys::llm_last_error())
        }))
    }
}

/// Calls `fill(buf, capacity, &mut n_bytes)` until the text fits, growing
/// the buffer to the size the library reports (NUL included). Three tries
/// bound the loop should the needed size keep changing.
pub(crate) fn read_text<F>(mut fill: F) -> Result<String>
where
    F: FnMut(*mut c_char, usize, &mut usize) -> sys::llm_status,
{
    let mut buf: Vec<u8> = vec![0; 256];
    for _ in 0..3 {
        let mut n_bytes = 0usize;
        let status = fill(buf.as_mut_ptr() as *mut c_char, buf.len(), &mut n_bytes);
        if status == sys::LLM_ERR_BUFFER_TOO_SMALL {
            // A 1.0/1.1 library reported the size without the NUL: grow anyway.
            let grown = if n_bytes > buf.len() {
                n_bytes
            } else {
                buf.len() * 2
            };
            buf.resize(grown, 0);
            continue;
        }
        check(status)?;
        buf.truncate(n_bytes.min(buf.len()));
        return Ok(match String::from_utf8(buf) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        });
    }
    Err(Error::new(
        Status::BufferTooSmall,
        "the text's size kept growing",
    ))
}

/// A NUL-terminated copy of `text` for a C call; interior NULs are an error.
pub(crate) fn c_string(text: &str, what: &str) -> Result<std::ffi::CString> {
    std::ffi::CString::new(text).map_err(|_| {
        Error::new(
            Status::InvalidArgument,
            format!("{} contains a NUL byte", what),
        )
    })
}
