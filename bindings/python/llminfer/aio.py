"""asyncio support: steps run in a worker thread, the event loop stays free."""

from __future__ import annotations

from typing import AsyncIterator

from ._handles import _RequestHost
from .request import Request, request_events

__all__ = ["request_events", "stream_text"]


async def stream_text(session: _RequestHost, request: Request) -> AsyncIterator[str]:
    """The text pieces of ``request`` (``Session.astream``)."""
    try:
        async for event in request_events(request):
            if event.text:
                yield event.text
            request._raise_if_failed(event)
    finally:
        request.close()
