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


# The adapter the Go and Rust suites write for the test model
# (bindings/go/adapter_test.go, bindings/rust/llminfer/tests/adapter.rs),
# written here the same way: a llama.cpp LoRA GGUF, rank 4, alpha 8, on
# attn_q and ffn_up of every layer, values (u - 0.5) / 2 from splitmix64
# (seed 31) with u the top 24 bits over 2^24 (exact in float32), A before B.
TEST_ADAPTER_FNV = 0x6A945CB9FACD1DF6


def write_test_adapter(info, path: Path) -> bytes:
    import struct
    mask = (1 << 64) - 1
    state = 31

    def values(n):
        nonlocal state
        out = []
        for _ in range(n):
            state = (state + 0x9E3779B97F4A7C15) & mask
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            z ^= z >> 31
            out.append(((z >> 40) / 16777216.0 - 0.5) * 0.5)
        return struct.pack(f"<{n}f", *out)

    rank = 4
    tensors = []
    for layer in range(info.n_layers):
        for target, n_in, n_out in (("attn_q", info.n_embd, info.n_embd),
                                    ("ffn_up", info.n_embd, info.n_ff)):
            name = f"blk.{layer}.{target}.weight"
            tensors.append((name + ".lora_a", (n_in, rank), values(rank * n_in)))
            tensors.append((name + ".lora_b", (rank, n_out), values(n_out * rank)))

    def text(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def pad(n):
        return (n + 31) // 32 * 32

    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 4))
    for key, value in (("general.architecture", info.architecture),
                       ("general.type", "adapter"), ("adapter.type", "lora")):
        out += text(key) + struct.pack("<I", 8) + text(value)
    out += text("adapter.lora.alpha") + struct.pack("<If", 6, 8.0)
    offset = 0
    for name, ne, data in tensors:
        out += text(name) + struct.pack("<IQQIQ", 2, ne[0], ne[1], 0, offset)
        offset = pad(offset + len(data))
    out += bytes(pad(len(out)) - len(out))
    base = len(out)
    for _, _, data in tensors:
        out += data
        out += bytes(base + pad(len(out) - base) - len(out))
    path.write_bytes(out)
    return bytes(out)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def test_written_adapter_equals_llm_run(model, tmp_path):
    """Greedy output with the adapter the Go and Rust suites also write is
    llm-run --lora's, and moves away from the base model's."""
    import subprocess
    from conftest import TEST_THREADS, model_path
    if not has("llm_adapter_load"):
        pytest.skip("the library has no LoRA adapters (API 1.4)")
    info = model.info
    path = tmp_path / "test-lora.gguf"
    data = write_test_adapter(info, path)
    if (info.n_layers, info.n_embd, info.n_ff) == (30, 576, 1536):
        assert fnv1a64(data) == TEST_ADAPTER_FNV, "the test adapter's bytes changed"
    prompt = "The capital of France is"
    with llminfer.Adapter(model, path) as adapter, \
            llminfer.Session(model, n_threads=TEST_THREADS, n_ctx=512) as s:
        with_adapter = s.generate(prompt, max_new_tokens=16, adapter=adapter, adapter_scale=0.5)
        without = s.generate(prompt, max_new_tokens=16)
    assert with_adapter.tokens != without.tokens
    runner = os.environ.get("LLMINFER_RUN")
    if not runner:
        pytest.skip("LLMINFER_RUN is not set: no llm-run --lora reference")
    run = subprocess.run(
        [runner, "-q", "-m", model_path(), "-p", prompt, "-n", "16", "--temp", "0",
         "-t", str(TEST_THREADS), "--lora", str(path), "--lora-scale", "0.5"],
        capture_output=True, check=True)
    assert run.stdout.decode("utf-8") == prompt + with_adapter.text + "\n"
