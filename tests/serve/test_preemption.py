"""64 streams on a server whose KV cache holds only a few of them at once:
requests are preempted and recomputed, and every stream must still equal
its non-streamed answer token for token. The KV pool is smaller than the
context here, so a request's default max_tokens must come from the pool."""
import json

from common import Suite, metrics, post_json, request
from test_http import test_concurrent_streams_match_non_stream


def test_preempted_streams_stay_exact():
    before = metrics()["llm_serve_preemptions_total"]
    test_concurrent_streams_match_non_stream()
    assert metrics()["llm_serve_preemptions_total"] > before, "nothing was preempted"


def test_default_max_tokens_fits_the_kv_pool():
    status, _, data = request("GET", "/v1/models")
    assert status == 200, data
    model = json.loads(data)["data"][0]
    pool, ctx = model["kv_cache_tokens"], model["max_model_len"]
    # run.sh: 12 MiB of KV cache, 17 blocks of 16 SmolLM2 tokens, context 1024.
    assert pool == 17 * 16 and ctx == 1024, model
    assert model["max_sequence_tokens"] == min(pool, ctx), model
    # No max_tokens: the answer runs until the sequence fills the pool.
    status, _, body = post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "ignore_eos": True, "temperature": 0})
    assert status == 200, body
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == pool, usage
    assert body["choices"][0]["finish_reason"] == "length", body
    # An explicit max_tokens past the pool is still the client's error.
    status, _, body = post_json("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 900})
    assert status == 400 and body["error"]["param"] == "max_tokens", body


if __name__ == "__main__":
    Suite("preemption").run([test_default_max_tokens_fits_the_kv_pool,
                             test_preempted_streams_stay_exact])
