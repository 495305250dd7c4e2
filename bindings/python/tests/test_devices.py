"""Session(device=..., tensor_parallel=..., devices=...): where a session
runs (llm_device_params). The library's reasons come back as exceptions,
and 3 CPU ranks give one rank's greedy tokens (SmolLM2's 9 heads split
in 1, 3 or 9)."""

import shutil
import subprocess

import pytest

import llminfer

from conftest import TEST_CTX, TEST_THREADS

PROMPT = "The capital of Germany is"


def _gpu_present() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.startswith("GPU ")


def _greedy(model: llminfer.Model, **where: object) -> tuple:
    with llminfer.Session(model, n_threads=TEST_THREADS, n_ctx=TEST_CTX,
                          kv_cache_bytes=32 << 20, **where) as s:
        return s.generate(PROMPT, max_new_tokens=8).tokens


@pytest.mark.parametrize("where, error, text", [
    ({"device": "bogus"}, llminfer.UnsupportedError, "no backend named 'bogus'"),
    ({"device": "cpu", "tensor_parallel": 2}, llminfer.UnsupportedError, "do not split"),
    ({"device": "cpu", "tensor_parallel": 3, "devices": [0]},
     llminfer.InvalidArgumentError, "devices"),
])
def test_refusals_say_why(model: llminfer.Model, where: dict, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        llminfer.Session(model, n_ctx=TEST_CTX, kv_cache_bytes=32 << 20, **where)


def test_cuda_without_a_gpu(model: llminfer.Model) -> None:
    if _gpu_present():
        pytest.skip("a GPU is present (make device-check covers it)")
    with pytest.raises(llminfer.UnsupportedError, match="backend 'cuda' is not available"):
        llminfer.Session(model, n_ctx=TEST_CTX, device="cuda")


def test_ranks_give_one_ranks_tokens(model: llminfer.Model) -> None:
    one = _greedy(model)
    assert len(one) > 0
    assert _greedy(model, device="cpu") == one
    assert _greedy(model, device="cpu", tensor_parallel=3) == one
    assert _greedy(model, device="cpu", tensor_parallel=3, devices=[0, 0, 0]) == one
    if not _gpu_present():
        assert _greedy(model, device="auto") == one
