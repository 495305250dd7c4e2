import os
import signal
import subprocess
import threading
import time
from typing import List

import pytest

import llminfer
from conftest import TEST_THREADS, drain, model_path

PROMPT = "The capital of France is"
N_TOKENS = 16


def test_greedy_generation_equals_llm_run(session: llminfer.Session) -> None:
    runner = os.environ.get("LLMINFER_RUN")
    if not runner:
        pytest.skip("LLMINFER_RUN is not set: no reference output")
    run = subprocess.run(
        [runner, "-m", model_path(), "-p", PROMPT, "-n", str(N_TOKENS), "--temp", "0",
         "-t", str(TEST_THREADS)],
        capture_output=True, check=True,
    )
    # llm-run prints the prompt, the generated text and a newline.
    expected = run.stdout.decode("utf-8")
    result = session.generate(PROMPT, max_new_tokens=N_TOKENS)
    assert expected == PROMPT + result.text + "\n"
    assert result.n_generated_tokens == len(result.tokens) == N_TOKENS
    assert result.finish_reason == llminfer.FinishReason.LENGTH


def test_streaming_equals_blocking(session: llminfer.Session) -> None:
    blocking = session.generate(PROMPT, max_new_tokens=N_TOKENS)
    pieces = list(session.stream(PROMPT, max_new_tokens=N_TOKENS))
    assert len(pieces) > 1
    assert "".join(pieces) == blocking.text
    seen: List[str] = []
    with_callback = session.generate(PROMPT, max_new_tokens=N_TOKENS, on_token=seen.append)
    assert "".join(seen) == with_callback.text == blocking.text


def test_request_events(session: llminfer.Session) -> None:
    tokens = session.model.tokenize(PROMPT, add_special=True, parse_special=True)
    request = session.submit(tokens, max_new_tokens=4, logprobs=True, top_logprobs=3)
    events = list(request)
    assert request.done
    assert events[-1].finished and events[-1].finish_reason == llminfer.FinishReason.LENGTH
    generated = [e for e in events if e.token is not None]
    assert len(generated) == 4
    for event in generated:
        assert event.logprob <= 0.0
        assert len(event.top_tokens) == 3 and event.top_tokens[0] == event.token


def test_seeded_sampling_is_reproducible(session: llminfer.Session) -> None:
    sampling = llminfer.SamplingParams(temperature=0.9, seed=1234)
    first = session.generate(PROMPT, max_new_tokens=N_TOKENS, sampling=sampling)
    second = session.generate(PROMPT, max_new_tokens=N_TOKENS, sampling=sampling)
    assert first.tokens == second.tokens
    streamed = "".join(session.stream(PROMPT, max_new_tokens=N_TOKENS, sampling=sampling))
    assert streamed == first.text
    banned = llminfer.SamplingParams(temperature=0, logit_bias={first.tokens[0]: float("-inf")})
    assert session.generate(PROMPT, max_new_tokens=1, sampling=banned).tokens != first.tokens[:1]


def test_invalid_sampling_names_the_field(session: llminfer.Session) -> None:
    with pytest.raises(llminfer.InvalidArgumentError) as caught:
        session.generate(PROMPT, max_new_tokens=2,
                         sampling=llminfer.SamplingParams(top_p=2.0))
    assert "top_p" in caught.value.message


def test_prompt_too_long_is_a_limit_error(session: llminfer.Session) -> None:
    with pytest.raises(llminfer.LimitError) as caught:
        session.submit([1] * 600)
    assert caught.value.status_name == "LLM_ERR_LIMIT" and caught.value.message


def test_concurrent_requests_in_one_session(session: llminfer.Session) -> None:
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
    solo = [session.generate(p, max_new_tokens=8).text for p in prompts]
    requests = [session.submit(p, max_new_tokens=8) for p in prompts]
    # Reading them one after the other still steps all of them together.
    assert [r.text() for r in requests] == solo

    results: List[str] = ["", "", ""]

    def consume(i: int) -> None:
        results[i] = "".join(session.stream(prompts[i], max_new_tokens=8))

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == solo


def test_leaving_a_stream_early_cancels_its_request(session: llminfer.Session) -> None:
    for piece in session.stream(PROMPT, max_new_tokens=200, ignore_eos=True):
        break
    drain(session)
    stats = session.stats()
    assert stats.n_running == 0 and stats.n_waiting == 0


def test_cancel_a_request(session: llminfer.Session) -> None:
    request = session.submit(PROMPT, max_new_tokens=200, ignore_eos=True)
    session.step()
    request.cancel()
    request.cancel()
    events = list(request)
    assert events[-1].finish_reason == llminfer.FinishReason.CANCELLED
    assert len([e for e in events if e.token is not None]) < 200


def _interrupt_until(session: llminfer.Session, stop: threading.Event) -> None:
    time.sleep(0.2)
    while not stop.is_set():
        session.interrupt()
        time.sleep(0.02)


def test_interrupt_generate_from_another_thread(session: llminfer.Session) -> None:
    stop = threading.Event()
    helper = threading.Thread(target=_interrupt_until, args=(session, stop))
    helper.start()
    try:
        result = session.generate(PROMPT, max_new_tokens=400, ignore_eos=True)
    finally:
        stop.set()
        helper.join()
    assert result.finish_reason == llminfer.FinishReason.CANCELLED
    assert result.n_generated_tokens < 400
    assert session.generate(PROMPT, max_new_tokens=2).n_generated_tokens == 2


def test_interrupt_stepping_cancels_the_stream(session: llminfer.Session) -> None:
    stop = threading.Event()
    helper = threading.Thread(target=_interrupt_until, args=(session, stop))
    helper.start()
    try:
        with pytest.raises(llminfer.LlmCancelledError):
            for _ in session.stream(PROMPT, max_new_tokens=400, ignore_eos=True):
                pass
    finally:
        stop.set()
        helper.join()
    drain(session)
    assert session.stats().n_running == 0


def _skip_unless_ctrl_c_reaches_python() -> None:
    """Ctrl-C tests need SIGINT delivered to Python's default handler: only
    the main thread receives signals, and a shell starts background jobs
    with SIGINT ignored (the binding then leaves it alone, as it should)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach only the main thread")
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler:
        what = "ignored (a background job?)" if handler == signal.SIG_IGN else f"handled by {handler!r}"
        pytest.skip(f"SIGINT is {what}: Ctrl-C cannot reach this process")


class _SigintSoon:
    """Sends SIGINT to this process shortly after ``start()``; started from
    inside a long generation, so the signal always lands in it."""

    def __init__(self) -> None:
        self.timer: "threading.Timer | None" = None

    def start(self, *_args: object) -> None:
        if self.timer is None:
            self.timer = threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGINT))
            self.timer.start()

    def join(self) -> None:
        if self.timer is not None:
            self.timer.join()


def test_ctrl_c_during_streaming_cancels_the_request(session: llminfer.Session) -> None:
    _skip_unless_ctrl_c_reaches_python()
    request = session.submit(PROMPT, max_new_tokens=400, ignore_eos=True)
    sigint = _SigintSoon()
    received = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in request:
                received += 1
                sigint.start()
    finally:
        sigint.join()
    assert 0 < received < 400
    drain(session)
    stats = session.stats()
    assert stats.n_running == 0 and stats.n_waiting == 0
    assert session.generate(PROMPT, max_new_tokens=2).n_generated_tokens == 2


def test_ctrl_c_during_generate(session: llminfer.Session) -> None:
    _skip_unless_ctrl_c_reaches_python()
    sigint = _SigintSoon()
    try:
        with pytest.raises(KeyboardInterrupt):
            session.generate(PROMPT, max_new_tokens=400, ignore_eos=True, on_token=sigint.start)
    finally:
        sigint.join()
    assert session.generate(PROMPT, max_new_tokens=2).n_generated_tokens == 2


def test_callback_exceptions_are_raised_after_the_call(session: llminfer.Session) -> None:
    calls = []

    def failing(piece: str) -> None:
        calls.append(piece)
        if len(calls) == 3:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        session.generate(PROMPT, max_new_tokens=50, ignore_eos=True, on_token=failing)
    assert len(calls) == 3
    stopped = session.generate(PROMPT, max_new_tokens=50, ignore_eos=True,
                               on_token=lambda piece: False)
    assert stopped.finish_reason == llminfer.FinishReason.CANCELLED
    assert stopped.n_generated_tokens == 1


def test_session_close_twice_and_use_after_close(model: llminfer.Model) -> None:
    session = llminfer.Session(model, n_threads=1, n_ctx=64)
    request = session.submit([1, 2, 3], max_new_tokens=4)
    session.close()
    session.close()
    for call in (lambda: session.generate("x", max_new_tokens=1), session.step,
                 session.stats, lambda: session.submit("x"), lambda: list(request)):
        with pytest.raises(llminfer.ClosedError) as caught:
            call()
        assert caught.value.status == llminfer.Status.INVALID_ARGUMENT
    session.interrupt()  # harmless on a closed session


def test_stepping_from_inside_on_token_is_refused(session: llminfer.Session) -> None:
    def nested(piece: str) -> None:
        session.generate(PROMPT, max_new_tokens=1)

    with pytest.raises(llminfer.InvalidArgumentError, match="on_token"):
        session.generate(PROMPT, max_new_tokens=4, on_token=nested)
    with pytest.raises(llminfer.InvalidArgumentError):
        session.generate(PROMPT, max_new_tokens=4, on_token=lambda piece: session.close())
    assert not session.closed
    assert session.generate(PROMPT, max_new_tokens=2).n_generated_tokens == 2


def test_stop_strings_and_samples(session: llminfer.Session) -> None:
    full = session.generate(PROMPT, max_new_tokens=N_TOKENS).text
    stop = full.split()[1]
    stopped = "".join(session.stream(PROMPT, max_new_tokens=N_TOKENS, stop_strings=[stop]))
    assert stop not in stopped and full.startswith(stopped)

    request = session.submit(PROMPT, max_new_tokens=4, n_samples=3,
                             sampling=llminfer.SamplingParams(seed=7))
    events = list(request)
    finishes = [e for e in events if e.finished]
    assert sorted(e.sample_index for e in finishes) == [0, 1, 2]
    assert request.done
