"""Session.create_chat_completion / Session.chat: OpenAI-shaped dicts.

The shapes follow OpenAI's chat.completions API (the fields its Python
client reads); the content is checked against what this model is known
to answer (docs/bench.md: llama.cpp gives the same sentence) and against
the token-level results of the same request."""

from typing import Any, Dict, List

import pytest

import llminfer

from conftest import drain

GERMANY = [{"role": "user", "content": "What is the capital of Germany?"}]


def _check_completion(r: Dict[str, Any], n: int = 1) -> None:
    assert r["object"] == "chat.completion"
    assert r["id"].startswith("chatcmpl-") and isinstance(r["created"], int)
    assert isinstance(r["model"], str) and r["model"]
    assert [c["index"] for c in r["choices"]] == list(range(n))
    for c in r["choices"]:
        assert c["message"]["role"] == "assistant"
        assert isinstance(c["message"]["content"], str)
        assert c["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_greedy_answer_and_usage(session: llminfer.Session) -> None:
    r = session.create_chat_completion(GERMANY, max_tokens=32)
    _check_completion(r)
    choice = r["choices"][0]
    assert choice["message"]["content"] == "The capital of Germany is Berlin."
    assert choice["finish_reason"] == "stop"
    model = session.model
    prompt = model.tokenize(model.apply_chat_template(GERMANY), add_special=True,
                            parse_special=True)
    assert r["usage"]["prompt_tokens"] == len(prompt)
    # The same request through the blocking call: same text, same count
    # (the end-of-turn token counts in neither).
    g = session.generate(prompt, max_new_tokens=32)
    assert g.text == choice["message"]["content"]
    assert r["usage"]["completion_tokens"] == g.n_generated_tokens
    assert r["model"] == "SmolLM2-135M-Instruct.Q4_1.gguf" or r["model"].endswith(".gguf")
    assert session.chat(GERMANY, max_tokens=32, model="mine")["model"] == "mine"


def test_length_and_stop(session: llminfer.Session) -> None:
    r = session.chat(GERMANY, max_tokens=3)
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 3
    r = session.chat(GERMANY, max_tokens=32, stop=["Berlin"])
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == "The capital of Germany is "
    r = session.chat(GERMANY, max_completion_tokens=2, stop="never appears")
    assert r["choices"][0]["finish_reason"] == "length"


def test_stream_chunks_add_up_to_the_completion(session: llminfer.Session) -> None:
    whole = session.chat(GERMANY, max_tokens=32)
    chunks: List[Dict[str, Any]] = list(session.chat(GERMANY, max_tokens=32, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    text = "".join(d.get("content", "") for d in deltas)
    assert text == whole["choices"][0]["message"]["content"]
    assert len(deltas) > 3  # streamed piece by piece, not in one go


def test_stream_left_early_cancels(session: llminfer.Session) -> None:
    stream = session.chat(GERMANY, max_tokens=200, stream=True)
    next(stream)
    next(stream)
    stream.close()
    drain(session)
    assert session.stats().n_running == 0
    assert session.chat(GERMANY, max_tokens=32)["choices"][0]["message"]["content"].endswith("Berlin.")


def test_n_choices_and_seeded_sampling(session: llminfer.Session) -> None:
    a = session.chat(GERMANY, max_tokens=8, n=2, temperature=1.0, seed=7)
    _check_completion(a, n=2)
    b = session.chat(GERMANY, max_tokens=8, n=2, temperature=1.0, seed=7)
    assert [c["message"] for c in a["choices"]] == [c["message"] for c in b["choices"]]
    assert 2 <= a["usage"]["completion_tokens"] <= 2 * 8  # both choices' tokens
    chunks = list(session.chat(GERMANY, max_tokens=4, n=2, stream=True))
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
    ends = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in ends) == [0, 1]


def test_logit_bias_bans_a_token(session: llminfer.Session) -> None:
    model = session.model
    berlin = model.tokenize(" Berlin", add_special=False)
    r = session.chat(GERMANY, max_tokens=16, logit_bias={str(berlin[0]): -100.0}, temperature=0)
    assert "Berlin" not in r["choices"][0]["message"]["content"]


def test_bad_arguments(session: llminfer.Session) -> None:
    with pytest.raises(llminfer.InvalidArgumentError):
        session.chat(GERMANY, n=0)
    with pytest.raises(TypeError):
        session.chat(GERMANY, tools=[])  # not supported: refused, not ignored


def test_openai_client_types_accept_the_dicts(session: llminfer.Session) -> None:
    """The official client's own types parse the results (when installed:
    make serve-venv has it)."""
    types = pytest.importorskip("openai.types.chat")
    types.ChatCompletion.model_validate(session.chat(GERMANY, max_tokens=8, n=2))
    for chunk in session.chat(GERMANY, max_tokens=8, stream=True):
        types.ChatCompletionChunk.model_validate(chunk)
