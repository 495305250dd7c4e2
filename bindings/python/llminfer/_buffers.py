"""The "too small? allocate what it reported and call again" pattern."""

from __future__ import annotations

import ctypes
from typing import Callable, Optional

from .errors import Status, check

# The reported size is exact, so one retry suffices; a few more only guard
# against a library that keeps asking for more.
_MAX_ATTEMPTS = 4
_FIRST_CAPACITY = 256

TextCall = Callable[["ctypes.Array[ctypes.c_char]", int, "ctypes.c_size_t"], int]


def read_text(call: TextCall, message: Optional[Callable[[], str]] = None,
              first_capacity: int = _FIRST_CAPACITY) -> str:
    """Runs ``call(buf, capacity, n_bytes)`` until the text fits; decodes it."""
    capacity = max(1, first_capacity)
    n_bytes = ctypes.c_size_t(0)
    for _ in range(_MAX_ATTEMPTS):
        buf = ctypes.create_string_buffer(capacity)
        status = call(buf, capacity, n_bytes)
        if status == Status.BUFFER_TOO_SMALL and n_bytes.value > capacity:
            capacity = n_bytes.value
            continue
        check(status, message)
        return buf.raw[: n_bytes.value].decode("utf-8", "replace")
    check(Status.BUFFER_TOO_SMALL, lambda: f"the text kept growing past {capacity} bytes")
    raise AssertionError("unreachable")
