"""Requests of the continuous-batching scheduler and their events."""

from __future__ import annotations

import collections
import functools
from typing import AsyncIterator, Deque, Iterator, List

from ._handles import _RequestHost
from .errors import LlmError, Status, error_for
from .params import Event, FinishReason


class _RequestState:
    """The events routed to one request; shared by its Request and Session."""

    __slots__ = ("queue", "n_samples", "finishes", "done", "abandoned")

    def __init__(self, n_samples: int) -> None:
        self.queue: Deque[Event] = collections.deque()
        self.n_samples = n_samples
        self.finishes = 0
        self.done = False
        self.abandoned = False

    def accept(self, event: Event) -> bool:
        """Queues ``event``; True once the request's last sample finished."""
        if not self.abandoned:
            self.queue.append(event)
        if event.finished:
            self.finishes += 1
            if self.finishes >= self.n_samples:
                self.done = True
        return self.done

    def has_news(self) -> bool:
        return bool(self.queue) or self.done


class Request:
    """A submitted request (``llm_request_id``).

    Iterating it (``for event in request``, or ``async for`` in asyncio
    code) steps the session whenever no event of this request is queued,
    and ends after the finish event of its last sample. Leaving such a loop
    early, by ``break``, an exception or Ctrl-C, cancels the request, as
    does leaving a ``with request:`` block.
    """

    def __init__(self, session: _RequestHost, request_id: int, n_samples: int) -> None:
        self.session = session
        self.id = request_id
        self._state = _RequestState(n_samples)
        self._adapter: object = None  # a LoRA adapter the library borrows until the end

    @property
    def done(self) -> bool:
        """True once every sample's finish event has been routed here."""
        return self._state.done

    def cancel(self) -> None:
        """``llm_session_cancel``: frees its KV memory now; thread-safe.

        Iteration then ends with a finish event of
        :attr:`FinishReason.CANCELLED` (unless it had already finished).
        """
        if self._state.done:
            return
        status = self.session._cancel(self.id)
        if status == Status.NOT_FOUND and self._state.done:
            return  # it finished on another thread in the meantime
        if status != Status.OK:
            raise error_for(status, f"cancelling request {self.id}")

    def close(self) -> None:
        """Cancels the request if it is still running and drops its events."""
        state = self._state
        state.abandoned = True
        state.queue.clear()
        if not state.done and not self.session.closed:
            try:
                self.cancel()
            except LlmError:
                pass  # best effort: the request is gone, or the session closing

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        return self.events()

    def events(self) -> Iterator[Event]:
        """Yields this request's events as the session produces them."""
        state = self._state
        try:
            while True:
                while state.queue:
                    yield state.queue.popleft()
                if state.done:
                    return
                self.session._advance(self)
        finally:
            if not (state.done and not state.queue):
                self.close()

    def __aiter__(self) -> AsyncIterator[Event]:
        return request_events(self)

    def text(self) -> str:
        """Runs the request to its end and returns its text (all samples')."""
        pieces: List[str] = []
        for event in self:
            pieces.append(event.text)
            self._raise_if_failed(event)
        return "".join(pieces)

    def _raise_if_failed(self, event: Event) -> None:
        if event.finish_reason == FinishReason.ERROR:
            raise error_for(event.status, f"request {self.id} failed")

    def __repr__(self) -> str:
        return f"<llminfer.Request {self.id} {'done' if self.done else 'running'}>"


async def request_events(request: Request) -> AsyncIterator[Event]:
    """Yields ``request``'s events; cancelling the task cancels the request.

    A step already running in the worker thread finishes there (a thread
    cannot be stopped from outside), but the request is cancelled at once,
    which frees its KV memory and ends it at the next step.
    """
    import asyncio  # here, so that ``import llminfer`` does not load asyncio

    state = request._state
    loop = asyncio.get_running_loop()
    try:
        while True:
            while state.queue:
                yield state.queue.popleft()
            if state.done:
                return
            await loop.run_in_executor(None, functools.partial(request.session._advance, request))
    finally:
        if not (state.done and not state.queue):
            request.close()
