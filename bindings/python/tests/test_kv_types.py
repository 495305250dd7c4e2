"""KV cache element types, the quantized ones (since 1.4) and FP8 (since 1.5) included."""

import pytest

import llminfer
from conftest import TEST_CTX, TEST_THREADS

PROMPT = "The history of the printing press begins in the fifteenth century, when"


def generate(model: llminfer.Model, kv_type: llminfer.KvType) -> llminfer.GenerateResult:
    with llminfer.Session(model, n_threads=TEST_THREADS, n_ctx=TEST_CTX, kv_type=kv_type) as s:
        return s.generate(PROMPT, max_new_tokens=24, ignore_eos=True)


def test_kv_type_values_match_the_header() -> None:
    assert [int(t) for t in llminfer.KvType] == [0, 1, 2, 3, 4, 5]
    assert llminfer.KvType.Q8_0 == 3 and llminfer.KvType.Q4_0 == 4
    assert llminfer.KvType.FP8_E4M3 == 5


def test_q8_0_follows_f16(model: llminfer.Model) -> None:
    f16 = generate(model, llminfer.KvType.F16)
    q8 = generate(model, llminfer.KvType.Q8_0)
    q4 = generate(model, llminfer.KvType.Q4_0)
    assert len(q8.tokens) == len(q4.tokens) == 24
    # SmolLM2-135M: the first 19 greedy tokens agree (tests/unit/test_kvquant.c).
    assert q8.tokens[:10] == f16.tokens[:10]


def test_fp8_follows_f16(model: llminfer.Model) -> None:
    f16 = generate(model, llminfer.KvType.F16)
    fp8 = generate(model, llminfer.KvType.FP8_E4M3)
    assert len(fp8.tokens) == 24
    assert fp8.tokens[:10] == f16.tokens[:10]


def test_unknown_kv_type_is_invalid(model: llminfer.Model) -> None:
    with pytest.raises(llminfer.InvalidArgumentError):
        llminfer.Session(model, n_threads=TEST_THREADS, n_ctx=TEST_CTX, kv_type=99)
