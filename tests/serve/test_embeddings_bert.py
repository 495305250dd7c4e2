"""POST /v1/embeddings with an encoder: llm-serve started on
all-MiniLM-L6-v2 (a BERT folder, `make model-minilm`). Text inputs get
[CLS] ... [SEP] from the model's tokenizer, and the vectors match the
NumPy reference of tests/golden/minilm-embed.txt (tests/unit/test_bert.c);
token-array inputs give the same vectors; an input past the 512 learned
positions is refused as too long."""
import math
import os

from common import Suite, post_json

URL = "/v1/embeddings"


def load_golden():
    here = os.path.dirname(os.path.abspath(__file__))
    texts, ids, mean = {}, {}, {}
    with open(os.path.join(here, "..", "golden", "minilm-embed.txt")) as f:
        for line in f:
            if line.startswith("#") or " : " not in line:
                continue
            head, rest = line.split(" : ", 1)
            kind = head.split()
            if kind[0] == "text":
                texts[int(kind[1])] = bytes.fromhex(kind[2]).decode()
                ids[int(kind[1])] = [int(t) for t in rest.split()]
            elif kind[0] == "mean":
                mean[int(kind[1])] = [float(x) for x in rest.split()]
    n = len(texts)
    return [texts[i] for i in range(n)], [ids[i] for i in range(n)], [mean[i] for i in range(n)]


TEXTS, IDS, MEAN = load_golden()


def cosine(a, b):
    ab = sum(x * y for x, y in zip(a, b))
    return ab / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embed(inputs):
    status, _, body = post_json(URL, {"input": inputs, "model": "minilm"})
    assert status == 200, (status, body)
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])], body


def test_texts_match_reference():
    vecs, body = embed(TEXTS)
    assert len(vecs) == len(TEXTS)
    for i, v in enumerate(vecs):
        assert len(v) == 384
        c = cosine(v, MEAN[i])
        assert c >= 0.9999, (i, c)
    # usage counts the [CLS] and [SEP] the tokenizer adds
    assert body["usage"]["prompt_tokens"] == sum(len(x) for x in IDS), body["usage"]


def test_token_inputs_equal_text_inputs():
    by_text, _ = embed(TEXTS[:3])
    by_ids, _ = embed(IDS[:3])
    for a, b in zip(by_text, by_ids):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6


def test_too_long():
    status, _, body = post_json(URL, {"input": [[1037] * 600], "model": "minilm"})
    assert status == 400, (status, body)
    assert "positions" in body["error"]["message"] or "context" in body["error"]["message"], body


if __name__ == "__main__":
    Suite("embeddings-bert").run([
        test_texts_match_reference, test_token_inputs_equal_text_inputs, test_too_long,
    ])
