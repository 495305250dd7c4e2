"""64 streams on a server whose KV cache holds only a few of them at once:
requests are preempted and recomputed, and every stream must still equal
its non-streamed answer token for token."""
from common import Suite, metrics
from test_http import test_concurrent_streams_match_non_stream


def test_preempted_streams_stay_exact():
    before = metrics()["llm_serve_preemptions_total"]
    test_concurrent_streams_match_non_stream()
    assert metrics()["llm_serve_preemptions_total"] > before, "nothing was preempted"


if __name__ == "__main__":
    Suite("preemption").run([test_preempted_streams_stay_exact])
