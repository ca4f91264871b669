"""Independent numpy references for the client's tests: a safetensors reader and a BERT forward
pass written from the Hugging Face BertModel definition (post-LayerNorm, erf GELU, mean pooling),
for the small model the test server serves as "tiny" (fuzz/tiny_model)."""
import json
import math
import pathlib
import struct

import numpy as np

_DTYPES = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}


def read_safetensors(path, names=None):
    """{name: array} of a safetensors file (8-byte header size, JSON header, raw data), as
    float64; `names`: only these tensors."""
    data = pathlib.Path(path).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    body = data[8 + size:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or (names is not None and name not in names):
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(body[start:end], dtype=_DTYPES[info["dtype"]]).reshape(
            info["shape"]).astype(np.float64)
    return out


def _layer_norm(x, weight, bias, eps=1e-12):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _linear(w, prefix, x):
    return x @ w[prefix + ".weight"].T + w[prefix + ".bias"]


def static_embeddings(w, ids, type_ids=None):
    """word + position + token type embeddings, before the LayerNorm: (T, hidden)."""
    ids = np.asarray(ids)
    type_ids = np.zeros_like(ids) if type_ids is None else np.asarray(type_ids)
    return (w["embeddings.word_embeddings.weight"][ids] +
            w["embeddings.position_embeddings.weight"][np.arange(len(ids))] +
            w["embeddings.token_type_embeddings.weight"][type_ids])


def forward(w, ids, num_heads):
    """Hidden states of every layer (L + 1, T, hidden) and attention weights (L, H, T, T)."""
    x = _layer_norm(static_embeddings(w, ids), w["embeddings.LayerNorm.weight"],
                    w["embeddings.LayerNorm.bias"])
    states, attentions = [x], []
    layer = 0
    while f"encoder.layer.{layer}.attention.self.query.weight" in w:
        p = f"encoder.layer.{layer}."
        t, hidden = x.shape
        d = hidden // num_heads

        def heads(y):
            return y.reshape(t, num_heads, d).transpose(1, 0, 2)

        q, k, v = (heads(_linear(w, p + "attention.self." + n, x))
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(t, hidden)
        x = _layer_norm(_linear(w, p + "attention.output.dense", context) + x,
                        w[p + "attention.output.LayerNorm.weight"],
                        w[p + "attention.output.LayerNorm.bias"])
        inner = _gelu(_linear(w, p + "intermediate.dense", x))
        x = _layer_norm(_linear(w, p + "output.dense", inner) + x,
                        w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        states.append(x)
        attentions.append(probs)
        layer += 1
    return np.stack(states), np.stack(attentions)


def sentence_embedding(w, ids, num_heads):
    """Mean pooling of the last hidden states, L2-normalised (sentence-transformers' modules)."""
    states, _ = forward(w, ids, num_heads)
    pooled = states[-1].mean(axis=0)
    return pooled / np.linalg.norm(pooled)


def relative_change(a, b):
    return float(np.linalg.norm(b - a) / np.linalg.norm(a))
