"""LoRA adapters (API 1.4) through the binding, on the tiny F32 Llama and
adapter that tests/models/gen_lora.py writes (``make test-models``; the
folder comes from LLM_TEST_MODELS, else build/test-models of the source
tree): greedy output with the adapter equals the output of the model with
the adapter merged into its weights."""
import os
from pathlib import Path

import pytest

import llminfer
from llminfer._native import has

MODELS = Path(os.environ.get("LLM_TEST_MODELS",
                             Path(__file__).resolve().parents[3] / "build" / "test-models"))
PROMPT = [1, 504, 2010, 77, 9001, 15, 31000, 42]


def need(name: str) -> Path:
    path = MODELS / name
    if not path.exists():
        pytest.skip(f"{path} is missing (make test-models)")
    if not has("llm_adapter_load"):
        pytest.skip("the library has no LoRA adapters (API 1.4)")
    return path


def greedy(model, **kw):
    with llminfer.Session(model, n_threads=2, n_ctx=128) as s:
        return list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True, **kw).tokens)


def test_adapter_matches_merged_model():
    base_path, merged_path = need("hf-llama-f32.gguf"), need("lora-llama-a-merged.gguf")
    with llminfer.Model(str(base_path)) as base, llminfer.Model(str(merged_path)) as merged:
        for adapter_file in ("lora-llama-a.gguf", "lora-llama-a"):  # GGUF and PEFT folder
            with llminfer.Adapter(base, need(adapter_file)) as adapter:
                want = greedy(merged)
                assert greedy(base, adapter=adapter) == want
                assert greedy(base) != want
                with llminfer.Session(base, n_threads=2, n_ctx=128) as s:
                    req = s.submit(PROMPT, max_new_tokens=10, ignore_eos=True, adapter=adapter)
                    got = [e.token for e in req if e.token is not None]
                assert got == want


def test_bad_adapter_and_closed_adapter():
    base_path = need("hf-llama-f32.gguf")
    with llminfer.Model(str(base_path)) as base:
        with pytest.raises(llminfer.BadFormatError):
            llminfer.Adapter(base, base_path)  # a model, not an adapter
        adapter = llminfer.Adapter(base, need("lora-llama-b.gguf"))
        adapter.close()
        with pytest.raises(llminfer.ClosedError):
            greedy(base, adapter=adapter)


def greedy_steps(session, seq, history, logits, n):
    """Feeds n greedy tokens after `logits`; returns each step's logits."""
    out = []
    for _ in range(n):
        token = max(range(len(logits)), key=lambda i: (logits[i], -i))
        history.append(token)
        with llminfer.Batch(1) as batch:
            row = batch.add(seq, len(history) - 1, token, logits=True)
            session.decode(batch)
            logits = session.logits(row)
        out.append(logits)
    return out


def test_restored_sequence_waits_for_its_adapter():
    """A sequence saved under an adapter refuses to decode after a restore
    until set_adapter gives it the same adapter (another load of the file)
    and scale; then it continues as if never saved."""
    base_path = need("hf-llama-f32.gguf")
    if not has("llm_seq_set_adapter"):
        pytest.skip("the library has no llm_seq_set_adapter (API 1.4)")
    with llminfer.Model(str(base_path)) as base, \
            llminfer.Adapter(base, need("lora-llama-a.gguf")) as a1, \
            llminfer.Adapter(base, need("lora-llama-a.gguf")) as a2, \
            llminfer.Adapter(base, need("lora-llama-b.gguf")) as b:
        with llminfer.Session(base, n_threads=2, n_ctx=128) as s:
            seq = s.open_sequence()
            seq.set_adapter(a1, 0.5)
            with llminfer.Batch(len(PROMPT)) as batch:
                row = batch.add_tokens(seq, 0, PROMPT)
                s.decode(batch)
                logits = s.logits(row)
            history = list(PROMPT)
            first = greedy_steps(s, seq, history, logits, 3)
            state = seq.save()
            want_history = list(history)
            want = greedy_steps(s, seq, want_history, first[-1], 4)
        with llminfer.Session(base, n_threads=2, n_ctx=128) as s:
            restored = s.load_sequence(state)
            with llminfer.Batch(1) as batch:
                batch.add(restored, len(history), 1, logits=True)
                with pytest.raises(llminfer.InvalidArgumentError, match="llm_seq_set_adapter"):
                    s.decode(batch)
            with pytest.raises(llminfer.InvalidArgumentError):
                restored.set_adapter(b, 0.5)
            with pytest.raises(llminfer.InvalidArgumentError):
                restored.set_adapter(a2, 1.0)
            fork = restored.fork()
            restored.set_adapter(a2, 0.5)
            got_history = list(history)
            got = greedy_steps(s, restored, got_history, first[-1], 4)
            assert got_history == want_history
            assert got == want
            with llminfer.Batch(1) as batch:  # the fork still waits
                batch.add(fork, len(history), 1, logits=True)
                with pytest.raises(llminfer.InvalidArgumentError):
                    s.decode(batch)
            fork.close()
