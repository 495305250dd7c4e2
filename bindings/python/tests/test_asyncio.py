import asyncio
from typing import List

import llminfer
from conftest import drain

PROMPT = "The capital of France is"


def test_async_streams_equal_blocking(session: llminfer.Session) -> None:
    prompts = ["Once upon a time", PROMPT]
    solo = [session.generate(p, max_new_tokens=8).text for p in prompts]

    async def collect(prompt: str) -> str:
        return "".join([piece async for piece in session.astream(prompt, max_new_tokens=8)])

    async def main() -> List[str]:
        return list(await asyncio.gather(*(collect(p) for p in prompts)))

    assert asyncio.run(main()) == solo


def test_async_request_events(session: llminfer.Session) -> None:
    async def main() -> List[llminfer.Event]:
        request = session.submit(PROMPT, max_new_tokens=3)
        return [event async for event in request]

    events = asyncio.run(main())
    assert events[-1].finish_reason == llminfer.FinishReason.LENGTH


def test_cancelling_the_task_cancels_the_request(session: llminfer.Session) -> None:
    received: List[str] = []

    async def consume() -> None:
        async for piece in session.astream(PROMPT, max_new_tokens=400, ignore_eos=True):
            received.append(piece)

    async def main() -> None:
        task = asyncio.create_task(consume())
        while len(received) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the task was not cancelled")

    asyncio.run(main())
    assert 3 <= len(received) < 400
    drain(session)
    stats = session.stats()
    assert stats.n_running == 0 and stats.n_waiting == 0
