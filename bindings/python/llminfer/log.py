"""Routing the library's log messages to Python."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any, Callable, Optional

from . import _native
from ._native import lib
from .params import LogLevel

LogHandler = Callable[[LogLevel, str], None]

_lock = threading.Lock()
_installed: Any = None  # the ctypes callback the library holds; must outlive its use


def _report(exc: BaseException, handler: LogHandler) -> None:
    hook_args = types.SimpleNamespace(
        exc_type=type(exc), exc_value=exc, exc_traceback=exc.__traceback__,
        err_msg="Exception in an llminfer log handler", object=handler,
    )
    sys.unraisablehook(hook_args)


def set_log_handler(handler: Optional[LogHandler], min_level: LogLevel = LogLevel.INFO) -> None:
    """Sends library messages at ``min_level`` and above to ``handler(level, text)``.

    The handler may be called from any of the library's threads, one call
    at a time. ``None`` silences the library again (its default). An
    exception in the handler never reaches the library: it goes to
    ``sys.unraisablehook`` and the message is dropped.
    """
    global _installed
    with _lock:
        if handler is None:
            lib.llm_log_set(_native.LOG_FN(), int(min_level), None)
            _installed = None
            return

        def sink(level: int, message: Optional[bytes], _user: Any) -> None:
            try:
                handler(LogLevel(level & 3), (message or b"").decode("utf-8", "replace"))
            except BaseException as exc:  # noqa: B036 - nothing may unwind into C
                try:
                    _report(exc, handler)
                except BaseException:
                    pass

        callback = _native.LOG_FN(sink)
        lib.llm_log_set(callback, int(min_level), None)
        # llm_log_set returned: the old sink is no longer running or going to
        # run, so its callback object may be released now.
        _installed = callback
