"""The real `cohere` Python package (PyPI) against attnserve's Cohere-shaped rerank.

Run by integration_cohere_rerank_test with the test venv's interpreter (scripts/setup.sh). The
expected values, written by that test: attnserve.v1.Encoder's Rerank scores for the same query
and documents (the core's method: cosine on a version without a pair head), and the documents'
and query's Encode embeddings, whose cosines numpy computes here as an independent reference.
Checks:
  * cohere.Client (v1, POST /v1/rerank): every document, return_documents, top_n;
  * cohere.ClientV2 (POST /v2/rerank);
  * the order best first, the indices into the request, relevance_score = Rerank's score and
    = numpy's cosine of the embeddings (<= 1e-6);
  * errors the client raises: an unknown model (NotFoundError), an over-long document
    without max_tokens_per_doc (BadRequestError naming it), and with it the call succeeds.
Exits 1 with the reason on the first failure.
"""
import argparse
import json
import sys

import cohere
import numpy as np

TOLERANCE = 1e-6


def check_results(name, results, expected, top_n, with_documents):
    documents = expected["documents"]
    scores = expected["rerank_scores"]  # by document index
    embeddings = np.asarray(expected["embeddings"], dtype=np.float64)
    query = np.asarray(expected["query_embedding"], dtype=np.float64)
    cosines = embeddings @ query / (np.linalg.norm(embeddings, axis=1) * np.linalg.norm(query))
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[:top_n]
    got = [r.index for r in results]
    if got != order:
        raise AssertionError(f"{name}: order {got}, expected {order}")
    worst_rerank = max(abs(r.relevance_score - scores[r.index]) for r in results)
    worst_cosine = max(abs(r.relevance_score - cosines[r.index]) for r in results)
    print(f"{name}: {len(results)} results, max abs difference to Rerank {worst_rerank:.3g}, "
          f"to numpy's cosine {worst_cosine:.3g}")
    if worst_rerank > TOLERANCE or worst_cosine > TOLERANCE:
        raise AssertionError(f"{name}: scores differ by {worst_rerank} / {worst_cosine}")
    for r in results:
        document = getattr(r, "document", None)
        if with_documents and (document is None or document.text != documents[r.index]):
            raise AssertionError(f"{name}: result {r.index} document {document!r}")
        if not with_documents and document is not None:
            raise AssertionError(f"{name}: a document came back unasked")


def expect_error(name, call, error_type, words):
    try:
        call()
    except error_type as e:
        body = json.dumps(e.body)
        for word in words:
            if word not in body:
                raise AssertionError(f"{name}: error body lacks {word!r}: {body}")
        print(f"{name}: {type(e).__name__} {e.status_code}: {body[:160]}")
        return
    raise AssertionError(f"{name}: no {error_type.__name__}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--expected", required=True)
    args = parser.parse_args()
    with open(args.expected) as f:
        expected = json.load(f)
    model = expected["model"]
    query, documents = expected["query"], expected["documents"]
    v1 = cohere.Client(api_key="-", base_url=args.base_url, timeout=120)
    v2 = cohere.ClientV2(api_key="-", base_url=args.base_url, timeout=120)

    response = v1.rerank(model=model, query=query, documents=documents, return_documents=True)
    check_results("v1 all, with documents", response.results, expected, len(documents), True)
    response = v1.rerank(query=query, documents=documents, top_n=2)
    check_results("v1 top_n=2, default model", response.results, expected, 2, False)
    response = v2.rerank(model=model, query=query, documents=documents, top_n=3)
    check_results("v2 top_n=3", response.results, expected, 3, False)

    expect_error("unknown model",
                 lambda: v1.rerank(model="rerank-english-v3.0", query=query, documents=documents),
                 cohere.errors.NotFoundError, ["rerank-english-v3.0"])
    long_document = " ".join(["word"] * 700)
    expect_error("over-long document",
                 lambda: v2.rerank(model=model, query=query, documents=[documents[0], long_document]),
                 cohere.errors.BadRequestError, ["1]", "max_tokens_per_doc"])
    cut = v2.rerank(model=model, query=query, documents=[documents[0], long_document],
                    max_tokens_per_doc=64)
    if sorted(r.index for r in cut.results) != [0, 1]:
        raise AssertionError(f"max_tokens_per_doc: results {cut.results}")
    print("max_tokens_per_doc=64: the long document cut and ranked")
    print("cohere client: all checks passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
