#!/usr/bin/env python3
"""Independent numpy reference for integration_evaluation_test: evaluation metrics from the
embeddings the server's Encode returned (not from the server's own scoring).

  retrieval FILE   FILE: {"queries": [[...]], "corpus": [[...]], "relevant": [i, ...]}
                   each query's relevant item ranked among the corpus by cosine (float64):
                   rank = 1 + the items scoring strictly higher; MRR@10, recall@1, recall@10,
                   nDCG@10 with one relevant item (ideal DCG 1)
  cosine FILE      FILE: {"first": [[...]], "second": [[...]], "scores": [...]}
                   Spearman's rho: Pearson's r of the ranks, ties given their mean rank

Prints one JSON object: {"metrics": {name: value}, "per_example": [...]}.
"""
import json
import sys

import numpy as np


def unit_rows(rows):
    m = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m / np.where(norms > 0, norms, 1.0)


def retrieval(data):
    q = unit_rows(data["queries"])
    c = unit_rows(data["corpus"])
    relevant = np.asarray(data["relevant"], dtype=np.int64)
    scores = q @ c.T  # (Q, N)
    target = scores[np.arange(len(q)), relevant][:, None]
    ranks = 1 + (scores > target).sum(axis=1)  # the relevant item never beats itself
    within = ranks <= 10
    return {
        "metrics": {
            "mrr@10": float(np.mean(np.where(within, 1.0 / ranks, 0.0))),
            "recall@1": float(np.mean(ranks == 1)),
            "recall@10": float(np.mean(within)),
            "ndcg@10": float(np.mean(np.where(within, 1.0 / np.log2(ranks + 1.0), 0.0))),
        },
        "per_example": [int(r) for r in ranks],
    }


def average_ranks(values):
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def cosine(data):
    a = unit_rows(data["first"])
    b = unit_rows(data["second"])
    cosines = np.sum(a * b, axis=1)
    ra = average_ranks(cosines)
    rb = average_ranks(data["scores"])
    rho = float(np.corrcoef(ra, rb)[0, 1])
    return {"metrics": {"spearman": rho}, "per_example": [float(x) for x in cosines]}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("retrieval", "cosine"):
        sys.exit(__doc__)
    with open(sys.argv[2]) as f:
        data = json.load(f)
    result = retrieval(data) if sys.argv[1] == "retrieval" else cosine(data)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
