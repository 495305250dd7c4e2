from pathlib import Path
from typing import List

import pytest

import llminfer

PROMPT = "The capital of France is"


def greedy_by_hand(session: llminfer.Session, seq: llminfer.TokenSequence,
                   prompt: List[int], n_new: int) -> List[int]:
    sampler = llminfer.Sampler(session.model)
    history = list(prompt)
    with llminfer.Batch(len(prompt)) as batch:
        row = batch.add_tokens(seq, 0, prompt)
        for _ in range(n_new):
            session.decode(batch)
            token = sampler.sample(session.logits(row), history, len(history) - len(prompt))
            history.append(token)
            batch.clear()
            row = batch.add(seq, len(history) - 1, token, logits=True)
    sampler.close()
    return history[len(prompt):]


def test_host_driven_decoding_equals_generate(session: llminfer.Session) -> None:
    prompt = session.model.tokenize(PROMPT, add_special=True, parse_special=True)
    expected = session.generate(prompt, max_new_tokens=6).tokens
    seq = session.open_sequence()
    assert list(greedy_by_hand(session, seq, prompt, 6)) == list(expected)
    assert len(seq) == len(prompt) + 5  # the last token is sampled, not decoded yet
    assert seq.tokens() == prompt + list(expected[:5])
    seq.close()


def test_sequence_state_round_trip(session: llminfer.Session, tmp_path: Path) -> None:
    prompt = session.model.tokenize(PROMPT, add_special=True, parse_special=True)
    seq = session.open_sequence()
    with llminfer.Batch(len(prompt)) as batch:
        row = batch.add_tokens(seq, 0, prompt)
        session.decode(batch)
        original = session.logits(row)
    state = seq.save()
    path = tmp_path / "seq.state"
    seq.save_file(path)
    fork = seq.fork()
    assert fork.tokens() == prompt
    fork.truncate(2)
    assert len(fork) == 2
    fork.close()
    seq.close()

    for restored in (session.load_sequence(state), session.load_sequence_file(path)):
        assert restored.tokens() == prompt
        with llminfer.Batch(1) as batch:
            # Recompute the last prompt position from the restored KV.
            restored.truncate(len(prompt) - 1)
            row = batch.add(restored, len(prompt) - 1, prompt[-1], logits=True)
            session.decode(batch)
            assert session.logits(row) == original
        restored.close()

    with pytest.raises(llminfer.BadFormatError):
        session.load_sequence(state[:-8] + b"garbage!")


def test_session_state_and_sampler_logprobs(session: llminfer.Session) -> None:
    prompt = session.model.tokenize(PROMPT, add_special=True, parse_special=True)
    seq = session.open_sequence()
    with llminfer.Batch(len(prompt)) as batch:
        row = batch.add_tokens(seq, 0, prompt)
        session.decode(batch)
    logits = session.logits(row)
    state = session.save_state()
    seq.close()
    session.load_state(state)
    assert session.sequence(seq.id).tokens() == prompt
    with llminfer.Sampler(session.model) as sampler:
        top = sampler.logprobs(logits, 3)
        assert len(top) == 3 and top[0][0] == sampler.sample(logits, prompt)
        assert top[0][1] >= top[1][1] >= top[2][1]
        with pytest.raises(llminfer.InvalidArgumentError):
            sampler.sample([0.0, 1.0], prompt)
    with pytest.raises(llminfer.InvalidArgumentError):
        session.logits(row + 1)
