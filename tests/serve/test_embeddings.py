"""POST /v1/embeddings: the official OpenAI client against llm-serve, the
vectors against llama.cpp's (tests/golden/smollm2-embed.txt, mean pooling),
and the error shapes over raw HTTP. With EMBED_MATRYOSHKA=1 (a server started
with --matryoshka) 'dimensions' below the model's width is checked too."""
import base64
import math
import os
import struct

import openai

from common import API_KEY, BASE_URL, Suite, post_json

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY or "none", max_retries=0)
MODEL_ID = client.models.list().data[0].id
MATRYOSHKA = os.environ.get("EMBED_MATRYOSHKA") == "1"
URL = "/v1/embeddings"
# llama.cpp's mean-pooled vectors against ours: see tests/unit/test_embed.c
# for why 0.9994 is the bound and not 0.9999.
MIN_COSINE = 0.9994


def load_golden():
    """Texts, their llama.cpp token ids and mean-pooled vectors."""
    here = os.path.dirname(os.path.abspath(__file__))
    texts, ids, mean = {}, {}, {}
    with open(os.path.join(here, "..", "golden", "smollm2-embed.txt")) as f:
        for line in f:
            if line.startswith("#") or ":" not in line:
                continue
            head, rest = line.split(":", 1)
            kind = head.split()
            if kind[0] == "text":
                texts[int(kind[1])] = bytes.fromhex(kind[2]).decode()
                ids[int(kind[1])] = [int(t) for t in rest.split()]
            elif kind[0] == "mean":
                mean[int(kind[1])] = [float(x) for x in rest.split()]
    n = len(texts)
    return [texts[i] for i in range(n)], [ids[i] for i in range(n)], [mean[i] for i in range(n)]


TEXTS, IDS, MEAN = load_golden()
N_EMBD = len(MEAN[0])


def cosine(a, b):
    ab = sum(x * y for x, y in zip(a, b))
    return ab / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def assert_error(status, body, want_status, param=None, contains=None, code=None):
    assert status == want_status, (status, body)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["type"] == "invalid_request_error" or want_status >= 500, err
    if param is not None:
        assert err["param"] == param, err
    if contains:
        assert contains in err["message"], err
    if code:
        assert err["code"] == code, err


def test_matches_llama_cpp():
    r = client.embeddings.create(model=MODEL_ID, input=TEXTS)
    assert r.object == "list" and r.model == MODEL_ID
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    cosines = []
    for d, want in zip(r.data, MEAN):
        assert d.object == "embedding" and len(d.embedding) == N_EMBD
        assert abs(norm(d.embedding) - 1.0) < 1e-5, norm(d.embedding)
        cosines.append(cosine(d.embedding, want))
    # The bounds of tests/unit/test_embed.c (this model's rounding noise).
    assert min(cosines) >= MIN_COSINE and sum(cosines) / len(cosines) >= 0.9998, cosines
    assert r.usage.prompt_tokens == sum(len(i) for i in IDS), r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens


def test_single_string_and_token_inputs():
    one = client.embeddings.create(model=MODEL_ID, input=TEXTS[2]).data[0].embedding
    from_ids = client.embeddings.create(model=MODEL_ID, input=IDS[2]).data[0].embedding
    many_ids = client.embeddings.create(model=MODEL_ID, input=[IDS[0], IDS[2]]).data
    assert max(abs(a - b) for a, b in zip(one, from_ids)) < 1e-6
    assert max(abs(a - b) for a, b in zip(one, many_ids[1].embedding)) < 1e-6
    assert cosine(many_ids[0].embedding, MEAN[0]) >= MIN_COSINE


def test_base64_equals_float():
    floats = client.embeddings.create(model=MODEL_ID, input=TEXTS[0],
                                      encoding_format="float").data[0].embedding
    status, _, body = post_json(URL, {"model": MODEL_ID, "input": TEXTS[0],
                                      "encoding_format": "base64"})
    assert status == 200, body
    raw = base64.b64decode(body["data"][0]["embedding"])
    decoded = struct.unpack("<%df" % N_EMBD, raw)
    assert max(abs(a - b) for a, b in zip(decoded, floats)) < 1e-6
    # The client asks for base64 by default and decodes it itself.
    r = client.embeddings.create(model=MODEL_ID, input=TEXTS[0])
    assert max(abs(a - b) for a, b in zip(r.data[0].embedding, floats)) < 1e-6


def test_dimensions():
    r = client.embeddings.create(model=MODEL_ID, input=TEXTS[1], dimensions=N_EMBD)
    assert len(r.data[0].embedding) == N_EMBD
    status, _, body = post_json(URL, {"model": MODEL_ID, "input": TEXTS[1], "dimensions": 64})
    if not MATRYOSHKA:
        assert_error(status, body, 400, param="dimensions", contains="--matryoshka")
        return
    assert status == 200, body
    short = body["data"][0]["embedding"]
    full = r.data[0].embedding
    assert len(short) == 64 and abs(norm(short) - 1.0) < 1e-5
    scale = norm(full[:64])
    assert max(abs(s - f / scale) for s, f in zip(short, full[:64])) < 1e-6
    status, _, body = post_json(URL, {"model": MODEL_ID, "input": "x", "dimensions": N_EMBD + 1})
    assert_error(status, body, 400, param="dimensions")


def test_bad_requests():
    cases = [
        ({"model": MODEL_ID}, "input", "required"),
        ({"model": MODEL_ID, "input": ""}, "input", "empty string"),
        ({"model": MODEL_ID, "input": []}, "input", "empty array"),
        ({"model": MODEL_ID, "input": ["a", ""]}, "input", "input[1] is an empty string"),
        ({"model": MODEL_ID, "input": [[]]}, "input", "empty array of tokens"),
        ({"model": MODEL_ID, "input": [1, -5]}, "input", "not a token id"),
        ({"model": MODEL_ID, "input": [1.5]}, "input", "not a token id"),
        ({"model": MODEL_ID, "input": [10 ** 7]}, "input", "not a token id"),
        ({"model": MODEL_ID, "input": 7}, "input", "must be a string"),
        ({"model": MODEL_ID, "input": ["a", 7]}, "input", "input[1] must be"),
        ({"model": MODEL_ID, "input": "a", "encoding_format": "int8"}, "encoding_format", None),
        ({"model": MODEL_ID, "input": "a", "dimensions": 0}, "dimensions", None),
        ({"model": MODEL_ID, "input": "a", "dimensions": "8"}, "dimensions", None),
        ({"model": MODEL_ID, "input": "a", "dimensions": 1e30}, "dimensions", None),
        ({"model": MODEL_ID, "input": "a", "dimensions": 4294967296}, "dimensions", None),
        ({"model": 5, "input": "a"}, "model", None),
        ({"model": MODEL_ID, "input": ["a"] * 2049}, "input", "at most 2048"),
    ]
    for req, param, contains in cases:
        status, _, body = post_json(URL, req)
        assert_error(status, body, 400, param=param, contains=contains)
    status, _, body = post_json(URL, "[1, 2]")
    assert_error(status, body, 400, contains="JSON object")
    try:
        client.embeddings.create(model=MODEL_ID, input="")
        raise AssertionError("an empty input was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400


def test_too_long():
    # The server runs with --ctx 1024.
    status, _, body = post_json(URL, {"model": MODEL_ID, "input": [[17] * 1025]})
    assert_error(status, body, 400, param="input", code="context_length_exceeded",
                 contains="more than this model's context of 1024")
    status, _, body = post_json(URL, {"model": MODEL_ID, "input": [[17] * 1024]})
    assert status == 200, body


def test_concurrent_with_generation():
    """Embeddings run between generation steps; both give their answers."""
    import threading
    results, errors = [], []

    def embed():
        try:
            results.append(client.embeddings.create(model=MODEL_ID, input=TEXTS[3]).data[0])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def generate():
        try:
            client.completions.create(model=MODEL_ID, prompt="Count: 1, 2,", max_tokens=24,
                                      temperature=0)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=f) for f in [generate, embed, generate, embed, embed]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for d in results:
        assert cosine(d.embedding, MEAN[3]) >= MIN_COSINE


if __name__ == "__main__":
    Suite("embeddings").run([
        test_matches_llama_cpp, test_single_string_and_token_inputs, test_base64_equals_float,
        test_dimensions, test_bad_requests, test_too_long, test_concurrent_with_generation,
    ])
