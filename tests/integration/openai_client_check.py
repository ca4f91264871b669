"""The real `openai` Python package (PyPI) against attnserve's /v1/embeddings.

Run by integration_http_test (HttpTest.OpenAiPythonClient) with the test venv's interpreter,
which scripts/setup.sh creates; the expected vectors are gRPC Encode's answers for the same
texts, written by that test. Checks, each to max abs difference <= 1e-6:
  * encoding_format="float";
  * the client's default (it asks for base64 and decodes the little-endian float32 bytes);
  * dimensions=N (Matryoshka truncation, re-normalised), float and base64;
and that models.list() names the served model. Exits 1 with the reason on the first failure.
"""
import argparse
import base64
import json
import struct
import sys

from openai import OpenAI

TOLERANCE = 1e-6


def max_abs(got, expected):
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} embeddings, expected {len(expected)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, expected)):
        if len(a) != len(b):
            raise AssertionError(f"embedding {i} has {len(a)} values, expected {len(b)}")
        worst = max([worst] + [abs(float(x) - float(y)) for x, y in zip(a, b)])
    return worst


def vector(embedding):
    # With encoding_format="base64" given explicitly the client hands the string back as is.
    if isinstance(embedding, str):
        raw = base64.b64decode(embedding)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return embedding


def check(name, response, expected):
    vectors = [vector(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
    worst = max_abs(vectors, expected)
    print(f"{name}: {len(vectors)} x {len(vectors[0])}, max abs difference {worst:.3g}")
    if worst > TOLERANCE:
        raise AssertionError(f"{name}: max abs difference {worst} > {TOLERANCE}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--expected", required=True)
    args = parser.parse_args()
    with open(args.expected) as f:
        expected = json.load(f)
    client = OpenAI(base_url=args.base_url, api_key="-", max_retries=0, timeout=120)
    model = "all-MiniLM-L6-v2"
    texts = expected["texts"]
    check("float", client.embeddings.create(model=model, input=texts, encoding_format="float"),
          expected["full"])
    check("base64 (client default)", client.embeddings.create(model=model, input=texts),
          expected["full"])
    dims = expected["dimensions"]
    for fmt in ("float", "base64"):
        check(f"dimensions={dims} {fmt}",
              client.embeddings.create(model=model, input=texts, dimensions=dims,
                                       encoding_format=fmt),
              expected["truncated"])
    usage = client.embeddings.create(model=model, input=texts[0]).usage
    if usage.prompt_tokens <= 0 or usage.total_tokens != usage.prompt_tokens:
        raise AssertionError(f"usage {usage}")
    ids = [m.id for m in client.models.list().data]
    if ids != [model]:
        raise AssertionError(f"models.list() gave {ids}")
    print("openai client: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints this output on failure
        print(f"openai client check FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
