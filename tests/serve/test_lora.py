"""LoRA adapters in llm-serve (--lora NAME=PATH, docs/lora.md): on the tiny
F32 Llama of tests/models/gen_hf_models.py with adapter a of
tests/models/gen_lora.py, a request whose "model" names the adapter gets
the tokens of a second server running the model with the adapter merged
into its weights by NumPy; the base model's name (or none) gets the base
model; an unknown name is 404 model_not_found; /v1/models lists the
adapter; requests of both kinds in flight together get what each gets
alone. Skipped when the test models are absent (make test-models)."""
import json
import os
import re
import subprocess
import sys
import threading

from common import BUILD, Suite, post_json, request

MODELS = os.environ.get("LLM_TEST_MODELS", os.path.join(BUILD, "test-models"))
BASE = os.path.join(MODELS, "hf-llama-f32.gguf")
ADAPTER = os.path.join(MODELS, "lora-llama-a.gguf")
MERGED = os.path.join(MODELS, "lora-llama-a-merged.gguf")
SERVER = os.environ.get("LLM_SERVE_BIN", os.path.join(BUILD, "llm-serve"))
PROMPT = [1, 504, 2010, 77, 9001, 15, 31000, 42]


def start(model, *args):
    proc = subprocess.Popen([SERVER, "-m", model, "--port", "0", "--ctx", "256", "-q", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"(http://127\.0\.0\.1:\d+)/v1", line)
    assert m, ("no URL printed", line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, m.group(1)


def complete(base, model=None, n=12):
    body = {"prompt": PROMPT, "max_tokens": n, "temperature": 0, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    status, _, out = post_json("/v1/completions", body, base=base, auth=False)
    return status, out


def main():
    if not all(os.path.exists(p) for p in (BASE, ADAPTER, MERGED)):
        print(f"test_lora: {MODELS} has no LoRA test models (make test-models); skipped")
        return
    lora, lora_url = start(BASE, "--lora", "tuned=" + ADAPTER)
    merged, merged_url = start(MERGED)
    plain, plain_url = start(BASE)
    try:
        def text(base, model=None):
            status, out = complete(base, model)
            assert status == 200, (status, out)
            return out["choices"][0]["text"], out["model"]

        def test_adapter_matches_merged_model():
            got, name = text(lora_url, "tuned")
            want, _ = text(merged_url)
            assert name == "tuned", name
            assert got == want, (got, want)

        def test_base_name_or_none_is_the_base_model():
            base, _ = text(plain_url)
            assert text(lora_url, "hf-llama-f32")[0] == base
            assert text(lora_url)[0] == base
            assert base != text(merged_url)[0]  # the adapter changes the output

        def test_unknown_model_is_404():
            status, out = complete(lora_url, "no-such-adapter")
            assert status == 404, (status, out)
            assert out["error"]["code"] == "model_not_found", out

        def test_models_lists_the_adapter():
            status, _, body = request("GET", "/v1/models", base=lora_url, auth=False)
            ids = {m["id"]: m for m in json.loads(body)["data"]}
            assert status == 200 and "tuned" in ids, ids
            assert ids["tuned"]["parent"] == "hf-llama-f32", ids["tuned"]

        def test_mixed_requests_in_flight():
            alone = {m: text(lora_url, m)[0] for m in ("tuned", "hf-llama-f32")}
            out = {}

            def one(i):
                m = ("tuned", "hf-llama-f32")[i % 2]
                out[i] = (m, text(lora_url, m)[0])
            threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for i, (m, got) in out.items():
                assert got == alone[m], (i, m, got, alone[m])
            assert len(out) == 8

        Suite("lora").run([test_adapter_matches_merged_model, test_base_name_or_none_is_the_base_model,
                           test_unknown_model_is_404, test_models_lists_the_adapter,
                           test_mixed_requests_in_flight])
    finally:
        for p in (lora, merged, plain):
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
    sys.exit(0)
