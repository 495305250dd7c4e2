import math

import pytest

import llminfer
from llminfer import Pooling

TEXTS = ["Paris is the capital of France.", "What is the capital of France?", "hello"]


def norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


def test_model_pooling(model: llminfer.Model) -> None:
    # SmolLM2's file names no pooling: the library's default is the mean.
    assert llminfer.model_pooling(model) == Pooling.MEAN


def test_texts_and_ids_agree(model: llminfer.Model, session: llminfer.Session) -> None:
    vectors = session.embed(TEXTS)
    assert len(vectors) == 3 and all(len(v) == model.info.n_embd for v in vectors)
    assert all(abs(norm(v) - 1.0) < 1e-5 for v in vectors)
    ids = model.tokenize(TEXTS[0], add_special=True)
    (one,) = session.embed(ids)
    assert max(abs(a - b) for a, b in zip(one, vectors[0])) < 1e-6
    # Similar sentences are closer than unrelated ones.
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2])


def test_mean_is_the_mean_of_the_token_states(session: llminfer.Session) -> None:
    rows = session.embed(TEXTS[0], pooling=Pooling.NONE, normalize=False)
    (mean,) = session.embed(TEXTS[0], pooling=Pooling.MEAN, normalize=False)
    (last,) = session.embed(TEXTS[0], pooling=Pooling.LAST, normalize=False)
    (first,) = session.embed(TEXTS[0], pooling=Pooling.FIRST, normalize=False)
    assert len(rows) > 3
    for k in range(0, len(mean), 37):
        want = sum(r[k] for r in rows) / len(rows)
        assert abs(mean[k] - want) < 1e-4 * (1 + abs(want))
    assert list(last) == list(rows[-1]) and list(first) == list(rows[0])
    assert norm(mean) > 1.0


def test_bad_input(session: llminfer.Session) -> None:
    with pytest.raises(llminfer.InvalidArgumentError) as caught:
        session.embed([[1, 2], []])
    assert "input 1 is empty" in caught.value.message
    with pytest.raises(llminfer.LimitError):
        session.embed([[5] * 600])  # the test sessions hold 512 tokens
    with pytest.raises(llminfer.InvalidArgumentError):
        session.embed([[10 ** 8]])
