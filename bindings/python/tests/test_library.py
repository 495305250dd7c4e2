import ctypes
import os
import pickle
import subprocess
import sys

import llminfer
from llminfer import _native


def test_version_is_1_2_or_newer() -> None:
    major, minor, _patch = (int(p) for p in llminfer.version_string().split("."))
    assert major == 1 and minor >= 2
    assert llminfer.version_number() == major * 10000 + minor * 100 + _patch


def test_struct_layouts_match_the_library() -> None:
    assert _native.layout_mismatches() == []
    for c_name, mirror in _native.STRUCTS.items():
        assert _native.lib.llm_struct_size(c_name.encode()) == ctypes.sizeof(mirror)


def test_layout_check_finds_a_wrong_mirror() -> None:
    class ShortEvent(ctypes.Structure):
        _fields_ = [("request", ctypes.c_uint64), ("text", ctypes.c_char_p),
                    ("no_such_field", ctypes.c_int)]

    problems = _native.layout_mismatches({"llm_event": ShortEvent})
    assert any(p.startswith("sizeof(llm_event)") for p in problems)
    assert "offsetof(llm_event, text) is 16 in the library, 8 here" in problems
    assert "offsetof(llm_event, no_such_field) is unknown in the library, 16 here" in problems


def test_version_check() -> None:
    assert _native.version_problem(10200) is None
    assert _native.version_problem(10307) is None
    assert "1.1.0 is loaded" in (_native.version_problem(10100) or "")
    assert _native.version_problem(20000) is not None


def test_library_reports_unknown_structs_and_fields() -> None:
    assert _native.lib.llm_struct_size(b"no_such_struct") == 0
    assert _native.lib.llm_struct_offset(b"llm_event", b"no_such_field") == _native.SIZE_MAX


def test_status_names_and_exception_classes() -> None:
    assert llminfer.status_name(llminfer.Status.OUT_OF_MEMORY) == "LLM_ERR_OUT_OF_MEMORY"
    assert llminfer.status_description(llminfer.Status.OK) == "success"
    error = llminfer.LlmError(llminfer.Status.LIMIT, "too long")
    assert (error.status, error.status_name, error.message) == (7, "LLM_ERR_LIMIT", "too long")
    assert "LLM_ERR_LIMIT" in str(error) and "too long" in str(error)
    assert isinstance(llminfer.errors.error_for(9), llminfer.NotFoundError)
    assert isinstance(llminfer.errors.error_for(1), ValueError)
    copy = pickle.loads(pickle.dumps(llminfer.errors.error_for(4, "bad header")))
    assert isinstance(copy, llminfer.BadFormatError)
    assert (copy.status, copy.message) == (4, "bad header")
    closed = pickle.loads(pickle.dumps(llminfer.ClosedError("session")))
    assert closed.message == "session is closed"


def test_missing_library_gives_a_clear_import_error() -> None:
    env = dict(os.environ, LLMINFER_LIBRARY="/nonexistent/libllminfer.so.1")
    run = subprocess.run(
        [sys.executable, "-c", "import llminfer"], env=env, capture_output=True, text=True
    )
    assert run.returncode != 0
    assert "LibraryNotFoundError" in run.stderr and "LLMINFER_LIBRARY" in run.stderr


def test_log_handler_exceptions_do_not_reach_the_library() -> None:
    seen = []

    def failing(level: llminfer.LogLevel, text: str) -> None:
        seen.append((level, text))
        raise RuntimeError("handler failure")

    hook_calls = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda args: hook_calls.append(args.exc_value)
    try:
        llminfer.set_log_handler(failing, llminfer.LogLevel.DEBUG)
        try:
            llminfer.Model("/nonexistent/model.gguf")
        except llminfer.LlmError:
            pass
    finally:
        llminfer.set_log_handler(None)
        sys.unraisablehook = old_hook
    assert seen, "a failed load logs at debug level"
    assert len(hook_calls) == len(seen)
    assert all(isinstance(e, RuntimeError) for e in hook_calls)
