"""asyncio support: steps run in a worker thread, the event loop stays free."""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, AsyncIterator

from .params import Event

if TYPE_CHECKING:
    from .request import Request
    from .session import Session


async def request_events(request: "Request") -> AsyncIterator[Event]:
    """Yields ``request``'s events; cancelling the task cancels the request.

    A step already running in the worker thread finishes there (a thread
    cannot be stopped from outside), but the request is cancelled at once,
    which frees its KV memory and ends it at the next step.
    """
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


async def stream_text(session: "Session", request: "Request") -> AsyncIterator[str]:
    """The text pieces of ``request`` (``Session.astream``)."""
    try:
        async for event in request_events(request):
            if event.text:
                yield event.text
            request._raise_if_failed(event)
    finally:
        request.close()
