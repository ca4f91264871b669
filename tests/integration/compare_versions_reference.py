#!/usr/bin/env python3
"""Independent numpy references for integration_compare_versions_test.

  weights A.safetensors B.safetensors [HEAD_A HEAD_B]
                                        per-tensor relative change ||B - A||_F / ||A||_F (float64),
                                        one JSON object per line: layer, matrix, part, relative
  neighbours MODEL.safetensors ID...    the 10 rows of the word-embedding table most similar
                                        (cosine, float64) to the mean of rows ID..., those ids
                                        left out; one JSON list of ids

Reads safetensors with the standard library and numpy only (8-byte little-endian header length,
JSON header, raw little-endian data), so it shares no code with the server.
"""
import json
import re
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64}


def load(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        for prefix in ("bert.",):
            if name.startswith(prefix):
                name = name[len(prefix):]
        tensors[name] = array
    return tensors


# Hugging Face BERT names -> (layer, matrix, part) as CompareVersions reports them.
LAYER_PARTS = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attention_output",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "ffn_norm",
}
EMBEDDING_PARTS = {
    "embeddings.word_embeddings": "word_embeddings",
    "embeddings.position_embeddings": "position_embeddings",
    "embeddings.token_type_embeddings": "token_type_embeddings",
    "embeddings.LayerNorm": "embedding_norm",
}


def classify(name):
    stem, part = name.rsplit(".", 1)
    if stem == "classifier":  # head.safetensors
        return -1, "head", part
    if stem in EMBEDDING_PARTS:
        return -1, EMBEDDING_PARTS[stem], part
    match = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", stem)
    if match and match.group(2) in LAYER_PARTS:
        return int(match.group(1)), LAYER_PARTS[match.group(2)], part
    return None


def weights(path_a, path_b, *heads):
    a, b = load(path_a), load(path_b)
    if heads:  # the two versions' head.safetensors
        a.update(load(heads[0]))
        b.update(load(heads[1]))
    for name in sorted(a):
        where = classify(name)
        if where is None or name not in b:
            continue  # position_ids, pooler: not encoder weights
        x = a[name].astype(np.float64)
        d = b[name].astype(np.float64) - x
        norm_a = np.sqrt(np.sum(x * x))
        norm_d = np.sqrt(np.sum(d * d))
        relative = norm_d / norm_a if norm_a > 0 else norm_d
        layer, matrix, part = where
        print(json.dumps({"layer": layer, "matrix": matrix, "part": part,
                          "relative": float(relative)}))


def neighbours(path, ids):
    table = load(path)["embeddings.word_embeddings.weight"].astype(np.float64)
    query = table[ids].mean(axis=0)
    cosine = table @ query / (np.linalg.norm(table, axis=1) * np.linalg.norm(query))
    cosine[ids] = -np.inf
    order = np.argsort(-cosine, kind="stable")[:10]
    print(json.dumps([int(i) for i in order]))


if __name__ == "__main__":
    if sys.argv[1] == "weights":
        weights(*sys.argv[2:])
    elif sys.argv[1] == "neighbours":
        neighbours(sys.argv[2], [int(i) for i in sys.argv[3:]])
    else:
        sys.exit("usage: weights A B | neighbours MODEL ID...")
