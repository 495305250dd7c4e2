"""The lowest layer under sessions: the native session handle and the part
of a session that its requests, sequences and mixins call back into.

``session.py`` sits on top and imports the modules that build on this one
(``request``, ``aio``, ``tokens``, ``embed``, ``model``); none of them
imports ``session``. They reach the session through the protocols below,
which :class:`~llminfer.Session` satisfies.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Optional, Protocol, Sequence

from ._native import lib
from .errors import InvalidArgumentError, Status


class _SessionHandle:
    """The native session pointer, freed once, never under a running call.

    Models keep these (not the Session objects) so that a model can free
    its sessions first whatever order the garbage collector picks.
    """

    def __init__(self, ptr: int, models: Sequence[Any]) -> None:
        self.ptr: Optional[int] = ptr
        self.lock = threading.RLock()  # held by every call that steps the session
        self.stepping_thread: Optional[int] = None
        self._models = [weakref.ref(m) for m in models]

    def free(self) -> None:
        if self.stepping_thread == threading.get_ident():
            raise InvalidArgumentError(
                Status.INVALID_ARGUMENT, "a session cannot be closed from its own callback"
            )
        with self.lock:
            ptr, self.ptr = self.ptr, None
            if ptr is not None:
                lib.llm_session_free(ptr)
        for ref in self._models:
            model = ref()
            if model is not None:
                model._detach(self)


class _SessionCalls(Protocol):
    """What token-level objects and the session mixins call on a session."""

    def _ptr(self) -> int: ...

    def _stepping_box(self) -> _SessionHandle: ...

    def _check(self, ptr: int, status: int) -> None: ...


class _RequestHost(Protocol):
    """What a request calls on the session it was submitted to."""

    @property
    def closed(self) -> bool: ...

    def _cancel(self, request_id: int) -> int: ...

    def _advance(self, request: Any) -> None: ...

