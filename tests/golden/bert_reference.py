"""A BERT encoder forward pass in NumPy, written from the BERT paper's
equations (Devlin et al. 2018, with the Transformer encoder of Vaswani et
al. 2017), for checking libllminfer's encoder against an implementation
that shares none of its code. float64 throughout.

    h0 = LayerNorm(E_tok[t] + E_pos[p] + E_type[0])
    per layer:
        A  = softmax(Q K^T / sqrt(d_head)) V  per head, over all positions
        h' = LayerNorm(h + A W_o + b_o)
        h  = LayerNorm(h' + GELU(h' W_1 + b_1) W_2 + b_2)
    GELU(x) = x * Phi(x) = x/2 * (1 + erf(x / sqrt(2)))

Weights are read with the `safetensors` package from a BertModel
checkpoint (Hugging Face names); PyTorch's Linear stores W as [out, in],
so y = x W^T + b.
"""

import json
import math
import os

import numpy as np
from safetensors.numpy import load_file

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class Bert:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            self.cfg = json.load(f)
        raw = load_file(os.path.join(folder, "model.safetensors"))
        self.w = {k[5:] if k.startswith("bert.") else k: v.astype(np.float64)
                  for k, v in raw.items() if v.dtype.kind == "f"}
        self.eps = float(self.cfg["layer_norm_eps"])
        self.n_head = int(self.cfg["num_attention_heads"])

    def linear(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def norm(self, x, name):
        return layer_norm(x, self.w[name + ".weight"], self.w[name + ".bias"], self.eps)

    def hidden(self, ids):
        """Final hidden states, [len(ids), hidden_size]."""
        n = len(ids)
        x = (self.w["embeddings.word_embeddings.weight"][ids] +
             self.w["embeddings.position_embeddings.weight"][:n] +
             self.w["embeddings.token_type_embeddings.weight"][0])
        x = self.norm(x, "embeddings.LayerNorm")
        d = x.shape[1] // self.n_head
        for layer in range(int(self.cfg["num_hidden_layers"])):
            p = f"encoder.layer.{layer}."
            q = self.linear(x, p + "attention.self.query").reshape(n, self.n_head, d)
            k = self.linear(x, p + "attention.self.key").reshape(n, self.n_head, d)
            v = self.linear(x, p + "attention.self.value").reshape(n, self.n_head, d)
            scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            scores -= scores.max(axis=-1, keepdims=True)
            prob = np.exp(scores)
            prob /= prob.sum(axis=-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", prob, v).reshape(n, -1)
            x = self.norm(x + self.linear(att, p + "attention.output.dense"),
                          p + "attention.output.LayerNorm")
            ff = gelu(self.linear(x, p + "intermediate.dense"))
            x = self.norm(x + self.linear(ff, p + "output.dense"), p + "output.LayerNorm")
        return x


def mean_normalized(hidden):
    """sentence-transformers' Pooling (mean over tokens) then Normalize."""
    v = hidden.mean(axis=0)
    return v / np.linalg.norm(v)
