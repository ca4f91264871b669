"""Chunked long-document embeddings against a numpy reference built from per-window Encode calls.

Run by integration_long_text_test (LongText.ChunkedEmbeddingEqualsANumpyReferenceOfPerWindowEncodes)
with the test venv's interpreter, against the real server's HTTP port. The reference follows the
rule the README states, independently of the server's code:

  * the document's token ids without [CLS]/[SEP]: N ids (here from /v1/tokenize of each
    sentence, concatenated: the document is the sentences joined by single spaces, and WordPiece
    starts afresh at every space; the server's own count of the whole document must agree);
  * windows of W = max_length - 2 ids starting at 0, S, 2S, ... with S = W - overlap (overlap
    default max_length // 8), the last one the first that reaches the end;
  * each window encoded on its own as [CLS] window [SEP] (an Encode call with token ids,
    normalize false): its pooled embedding e_k, weight T_k = len(window) + 2;
  * embedding = sum_k T_k e_k / sum_k T_k (float64), then the first `dimensions` values, then
    L2-normalised (the model default, normalize true).

The server's answers (/v1/encode with longText LONG_TEXT_CHUNK, and /v1/embeddings with
long_text chunk) must equal it to 1e-5, say how many windows they used and how many tokens the
document had, and leave short inputs of the same request as a plain Encode gives them. Exits 1
with the reason on the first failure.
"""
import argparse
import json
import sys
import urllib.error
import urllib.request

import numpy as np

TOLERANCE = 1e-5

SENTENCES = [
    "The river that runs through the old town floods every spring.",
    "Engineers raised the stone walls twice in the last century, and still the water came.",
    "Shopkeepers keep sandbags behind their counters; children learn the warning bells early.",
    "In 1998 the council finally built a channel to carry the melt water around the town.",
    "Since then the streets have stayed dry, but the fish market moved down to the harbour.",
    "Visitors now come for the bridges, eleven of them, each built in a different style.",
    "The oldest is a wooden footbridge that the carpenters' guild repairs every summer.",
    "Its planks are numbered, and a family can sponsor one for a modest yearly fee.",
]


def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path} answered {e.code}: {e.read()[:400]!r}") from None


def token_ids(port, text):
    tokens = post(port, "/v1/tokenize", {"inputs": [{"text": text}]})["results"][0]["tokens"]
    return [t.get("id", 0) for t in tokens]


def windows(n, max_length, overlap):
    width = max_length - 2
    stride = width - overlap
    starts = [0]
    while starts[-1] + width < n:
        starts.append(starts[-1] + stride)
    return [(s, min(s + width, n)) for s in starts]


def reference(port, ids, cls, sep, max_length, overlap, pooling, dimensions):
    spans = windows(len(ids), max_length, overlap)
    inputs = [{"tokens": {"ids": [cls] + ids[a:b] + [sep]}} for a, b in spans]
    total = np.zeros(0)
    weights = 0.0
    for item, (a, b) in zip(inputs, spans):  # one Encode call per window
        body = {"inputs": [item], "normalize": False}
        if pooling:
            body["pooling"] = pooling
        e = np.array(post(port, "/v1/encode", body)["results"][0]["embedding"], dtype=np.float64)
        total = e * (b - a + 2) if total.size == 0 else total + e * (b - a + 2)
        weights += b - a + 2
    mean = total / weights
    if dimensions:
        mean = mean[:dimensions]
    return mean / np.linalg.norm(mean), len(spans)


def server_chunked(port, texts, max_length, overlap, pooling, dimensions):
    body = {"inputs": [{"text": t} for t in texts], "longText": "LONG_TEXT_CHUNK"}
    if max_length:
        body["tokenization"] = {"maxLength": max_length}
    if overlap is not None:
        body["chunkOverlap"] = overlap
    if pooling:
        body["pooling"] = pooling
    if dimensions:
        body["dimensions"] = dimensions
    return post(port, "/v1/encode", body)["results"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--http-port", type=int, required=True)
    port = parser.parse_args().http_port
    cls, sep = token_ids(port, "x")[0], token_ids(port, "x")[-1]
    sentences = SENTENCES * 6  # about 1,000 tokens
    document = " ".join(sentences)
    ids = [i for s in sentences for i in token_ids(port, s)[1:-1]]
    print(f"document: {len(document)} characters, {len(ids)} + 2 tokens")

    configs = [  # max_length, overlap, pooling, dimensions
        (None, None, None, None),  # the defaults: 256, 32, the model's mean pooling, all 384
        (128, 16, "POOLING_MEAN", None),
        (64, 0, "POOLING_CLS", None),
        (96, 40, "POOLING_MAX", 64),
        (512, 100, None, None),
    ]
    for max_length, overlap, pooling, dimensions in configs:
        length = max_length or 256
        want, count = reference(port, ids, cls, sep, length,
                                length // 8 if overlap is None else overlap, pooling, dimensions)
        got = server_chunked(port, [document], max_length, overlap, pooling, dimensions)[0]
        worst = float(np.max(np.abs(np.array(got["embedding"]) - want)))
        name = f"max_length {length} overlap {overlap} {pooling or 'default'} dims {dimensions}"
        print(f"{name}: {count} windows, max abs difference {worst:.3g}")
        if worst > TOLERANCE:
            raise AssertionError(f"{name}: max abs difference {worst} > {TOLERANCE}")
        if got.get("chunks") != count:
            raise AssertionError(f"{name}: the server says {got.get('chunks')} windows, not {count}")
        if got.get("untruncatedLength") != len(ids) + 2 or got.get("truncated", False):
            raise AssertionError(f"{name}: untruncatedLength {got.get('untruncatedLength')}, "
                                 f"truncated {got.get('truncated')}; expected {len(ids) + 2}")

    # Short inputs in the same request are encoded as usual; order is kept.
    short = ["A short sentence.", "Another one, just as short."]
    mixed = server_chunked(port, [short[0], document, short[1]], None, None, None, None)
    plain = post(port, "/v1/encode", {"inputs": [{"text": t} for t in short]})["results"]
    alone = server_chunked(port, [document], None, None, None, None)[0]
    for got, want in ((mixed[0], plain[0]), (mixed[2], plain[1]), (mixed[1], alone)):
        worst = float(np.max(np.abs(np.array(got["embedding"]) - np.array(want["embedding"]))))
        if worst > TOLERANCE:
            raise AssertionError(f"mixed request: max abs difference {worst} > {TOLERANCE}")
    if [r.get("chunks") for r in mixed] != [1, alone["chunks"], 1]:
        raise AssertionError(f"mixed request: chunks {[r.get('chunks') for r in mixed]}")
    print("mixed request: short inputs as plain Encode, the document as alone")

    # The OpenAI route, chunking on request.
    openai = post(port, "/v1/embeddings", {"input": [document, short[0]], "long_text": "chunk"})
    for item, want in zip(openai["data"], (alone, plain[0])):
        worst = float(np.max(np.abs(np.array(item["embedding"]) - np.array(want["embedding"]))))
        if worst > TOLERANCE or item.get("chunks") != want.get("chunks", 1):
            raise AssertionError(f"/v1/embeddings item {item['index']}: difference {worst}, "
                                 f"chunks {item.get('chunks')}")
    if openai["data"][0].get("input_tokens") != len(ids) + 2:
        raise AssertionError(f"/v1/embeddings input_tokens {openai['data'][0].get('input_tokens')}")
    print("/v1/embeddings long_text chunk: as /v1/encode")
    print("long text reference: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints this output on failure
        print(f"long text reference FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
