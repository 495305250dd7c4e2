"""Status codes of llm.h and the exceptions that carry them."""

from __future__ import annotations

import enum
from typing import Any, Callable, Dict, Optional, Tuple, Type

from ._native import lib


class Status(enum.IntEnum):
    """``llm_status``: the result of every fallible call."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    IO = 3
    BAD_FORMAT = 4
    UNSUPPORTED = 5
    BUFFER_TOO_SMALL = 6
    LIMIT = 7
    INVALID_UTF8 = 8
    NOT_FOUND = 9
    CANCELLED = 10
    BACKEND = 11
    INTERNAL = 12


def status_name(status: int) -> str:
    """The C enumerator name, e.g. ``"LLM_ERR_OUT_OF_MEMORY"``."""
    return str(lib.llm_status_name(int(status)).decode())


def status_description(status: int) -> str:
    """The library's short description, e.g. ``"out of memory"``."""
    return str(lib.llm_status_str(int(status)).decode())


class LlmError(Exception):
    """A call into libllminfer failed.

    ``status`` is the ``llm_status`` code, ``status_name`` its enumerator
    name and ``message`` the library's detailed message (or its status
    description when it gave none).
    """

    status: int
    status_name: str
    message: str

    def __init__(self, status: int, message: str = "") -> None:
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.message = message or status_description(self.status)
        super().__init__(f"{self.status_name}: {self.message}")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (type(self), (self.status, self.message))


class InvalidArgumentError(LlmError, ValueError):
    """LLM_ERR_INVALID_ARGUMENT."""


class OutOfMemoryError(LlmError, MemoryError):
    """LLM_ERR_OUT_OF_MEMORY."""


class LlmIOError(LlmError, OSError):
    """LLM_ERR_IO: a file could not be read or written."""


class BadFormatError(LlmError):
    """LLM_ERR_BAD_FORMAT: a malformed or corrupt file."""


class UnsupportedError(LlmError):
    """LLM_ERR_UNSUPPORTED."""


class BufferTooSmallError(LlmError):
    """LLM_ERR_BUFFER_TOO_SMALL (the binding retries these itself)."""


class LimitError(LlmError):
    """LLM_ERR_LIMIT: a context, KV memory or batch limit."""


class InvalidUtf8Error(LlmError, ValueError):
    """LLM_ERR_INVALID_UTF8."""


class NotFoundError(LlmError, LookupError):
    """LLM_ERR_NOT_FOUND."""


class LlmCancelledError(LlmError):
    """LLM_ERR_CANCELLED: the call was interrupted (``Session.interrupt``)."""


class BackendError(LlmError):
    """LLM_ERR_BACKEND."""


class InternalError(LlmError):
    """LLM_ERR_INTERNAL."""


class ClosedError(InvalidArgumentError):
    """The model or session was closed; its native handle is gone."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(Status.INVALID_ARGUMENT, f"{what} is closed")

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return (type(self), (self.what,))


_BY_STATUS: Dict[int, Type[LlmError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.IO: LlmIOError,
    Status.BAD_FORMAT: BadFormatError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.BUFFER_TOO_SMALL: BufferTooSmallError,
    Status.LIMIT: LimitError,
    Status.INVALID_UTF8: InvalidUtf8Error,
    Status.NOT_FOUND: NotFoundError,
    Status.CANCELLED: LlmCancelledError,
    Status.BACKEND: BackendError,
    Status.INTERNAL: InternalError,
}


def error_for(status: int, message: str = "") -> LlmError:
    """The exception of the right subclass for ``status``."""
    return _BY_STATUS.get(int(status), LlmError)(status, message)


def thread_last_error() -> str:
    """``llm_last_error()``: only meaningful right after a failure on this thread."""
    return str(lib.llm_last_error().decode("utf-8", "replace"))


def check(status: int, message: Optional[Callable[[], str]] = None) -> None:
    """Raises for a non-OK ``status``; ``message`` reads the failure's text.

    Without ``message`` the calling thread's ``llm_last_error()`` is read,
    which is right in Python: a ctypes call runs on the calling OS thread,
    and nothing else runs on it between the failing call and this one.
    """
    if status != Status.OK:
        raise error_for(status, message() if message else thread_last_error())

