"""The real `tritonclient` package (PyPI, grpc and http) against attnserve's Open Inference
Protocol front end.

Run by integration_oip_test (OipTest.TritonClient) with the test venv's interpreter, which
scripts/setup.sh creates. The expected values are attnserve.v1.Encoder's answers for the same
inputs (gRPC Encode and AttentionMap), written by that test. Through both protocols:
  * health (live, ready, model ready), server metadata, model metadata, get_model_config;
  * EMBEDDING for TEXT equal to Encode's embeddings (max abs difference <= 1e-6), raw tensors
    (the client's default) and, over HTTP, JSON tensors too;
  * INPUT_IDS (with ATTENTION_MASK padding) equal to Encode of the same token ids;
  * TOKEN_EMBEDDINGS and ATTENTION (zero-padded) equal to Encode's token embeddings and
    AttentionMap's weights; TOKEN_COUNT; parameters (dimensions, normalize);
  * an unknown model: NOT_FOUND (gRPC) / 404 (HTTP); a bad shape and a bad datatype:
    INVALID_ARGUMENT / 400, each message naming the tensor.
Exits 1 with the reason on the first failure.
"""
import argparse
import json
import sys

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

TOLERANCE = 1e-6
MODEL = "all-MiniLM-L6-v2"


def check_close(name, got, expected):
    got = np.asarray(got, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    if got.shape != expected.shape:
        raise AssertionError(f"{name}: shape {got.shape}, expected {expected.shape}")
    worst = float(np.max(np.abs(got - expected))) if got.size else 0.0
    print(f"{name}: {got.shape}, max abs difference {worst:.3g}")
    if worst > TOLERANCE:
        raise AssertionError(f"{name}: max abs difference {worst} > {TOLERANCE}")


def expect_error(name, call, grpc_status, http_status, words):
    try:
        call()
    except InferenceServerException as e:
        status, message = str(e.status()), e.message() or ""
        if status not in (grpc_status, http_status):
            raise AssertionError(f"{name}: status {status}, expected {grpc_status}/{http_status}: "
                                 f"{message}")
        for word in words:
            if word not in message:
                raise AssertionError(f"{name}: message lacks {word!r}: {message}")
        print(f"{name}: {status}: {message}")
        return
    raise AssertionError(f"{name}: no error")


def text_input(module, texts, binary=True):
    tensor = module.InferInput("TEXT", [len(texts)], "BYTES")
    array = np.array([t.encode("utf-8") for t in texts], dtype=np.object_)
    if module is thttp:
        tensor.set_data_from_numpy(array, binary_data=binary)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


def outputs(module, names, binary=True):
    if module is thttp:
        return [module.InferRequestedOutput(n, binary_data=binary) for n in names]
    return [module.InferRequestedOutput(n) for n in names]


def check_metadata(label, client, module, expected):
    if not (client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL)):
        raise AssertionError(f"{label}: not live/ready")
    server = client.get_server_metadata()
    model = client.get_model_metadata(MODEL)
    config = client.get_model_config(MODEL)
    if module is tgrpc:
        server = {"name": server.name, "extensions": list(server.extensions)}
        model = {"name": model.name, "versions": list(model.versions),
                 "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                            for t in model.inputs],
                 "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                             for t in model.outputs]}
        config = {"name": config.config.name, "max_batch_size": config.config.max_batch_size,
                  "output": [{"name": o.name, "dims": list(o.dims)} for o in config.config.output]}
    if server["name"] != "attnserve" or "model_configuration" not in server["extensions"]:
        raise AssertionError(f"{label}: server metadata {server}")
    if model["name"] != MODEL or expected["version"] not in model["versions"]:
        raise AssertionError(f"{label}: model metadata {model}")
    text = [t for t in model["inputs"] if t["name"] == "TEXT"]
    embedding = [t for t in model["outputs"] if t["name"] == "EMBEDDING"]
    if text != [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}] or embedding != [
            {"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, expected["hidden"]]}]:
        raise AssertionError(f"{label}: tensors {model['inputs']} -> {model['outputs']}")
    config_embedding = [o for o in config["output"] if o["name"] == "EMBEDDING"]
    if config["name"] != MODEL or config["max_batch_size"] != 0 or [
            list(o["dims"]) for o in config_embedding] != [[-1, expected["hidden"]]]:
        raise AssertionError(f"{label}: config {config}")
    print(f"{label}: live, ready, metadata and config as served")


def check_embeddings(label, client, module, expected, binary=True):
    texts = expected["texts"]
    result = client.infer(MODEL, [text_input(module, texts, binary)],
                          outputs=outputs(module, ["EMBEDDING", "TOKEN_COUNT"], binary))
    check_close(f"{label} EMBEDDING", result.as_numpy("EMBEDDING"), expected["embeddings"])
    counts = result.as_numpy("TOKEN_COUNT").tolist()
    if counts != expected["token_counts"]:
        raise AssertionError(f"{label}: TOKEN_COUNT {counts}, expected {expected['token_counts']}")
    response = result.get_response()
    version = response.model_version if module is tgrpc else response["model_version"]
    if version != expected["version"]:
        raise AssertionError(f"{label}: model_version {version!r}")
    # The default outputs: EMBEDDING alone.
    default = client.infer(MODEL, [text_input(module, texts, binary)])
    check_close(f"{label} EMBEDDING (default outputs)", default.as_numpy("EMBEDDING"),
                expected["embeddings"])
    dims = client.infer(MODEL, [text_input(module, texts, binary)],
                        parameters={"dimensions": expected["dimensions"]})
    check_close(f"{label} EMBEDDING dimensions={expected['dimensions']}",
                dims.as_numpy("EMBEDDING"), expected["embeddings_dimensions"])


def check_token_ids(label, client, module, expected):
    ids = expected["token_ids"]
    longest = max(len(row) for row in ids)
    padded = np.zeros((len(ids), longest), dtype=np.int64)
    mask = np.zeros((len(ids), longest), dtype=np.int64)
    for i, row in enumerate(ids):
        padded[i, :len(row)] = row
        mask[i, :len(row)] = 1
    tensors = []
    for name, array in (("INPUT_IDS", padded), ("ATTENTION_MASK", mask)):
        tensor = module.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(MODEL, tensors, outputs=outputs(module, ["EMBEDDING"]))
    check_close(f"{label} INPUT_IDS EMBEDDING", result.as_numpy("EMBEDDING"),
                expected["embeddings"])


def check_tokens_and_attention(label, client, module, expected):
    texts = expected["texts"]
    result = client.infer(MODEL, [text_input(module, texts)],
                          outputs=outputs(module, ["TOKEN_EMBEDDINGS", "ATTENTION"]),
                          parameters={"layers": str(expected["layer"])})
    tokens = result.as_numpy("TOKEN_EMBEDDINGS")  # (input, layer, token, hidden)
    attention = result.as_numpy("ATTENTION")  # (input, layer, head, query, key)
    longest = max(len(rows) for rows in expected["token_embeddings"])
    for i, rows in enumerate(expected["token_embeddings"]):
        check_close(f"{label} TOKEN_EMBEDDINGS[{i}]", tokens[i, 0, :len(rows)], rows)
        check_close(f"{label} TOKEN_EMBEDDINGS[{i}] padding", tokens[i, 0, len(rows):],
                    np.zeros((longest - len(rows), tokens.shape[-1])))
        weights = np.asarray(expected["attention"][i], dtype=np.float32)  # (heads, T, T)
        t = weights.shape[-1]
        check_close(f"{label} ATTENTION[{i}]", attention[i, 0, :, :t, :t], weights)


def check_errors(label, client, module):
    texts = ["a text"]
    expect_error(f"{label} unknown model",
                 lambda: client.infer("no-such-model", [text_input(module, texts)]),
                 "StatusCode.NOT_FOUND", "404", ["no-such-model"])
    expect_error(f"{label} unknown model metadata",
                 lambda: client.get_model_metadata("no-such-model"),
                 "StatusCode.NOT_FOUND", "404", ["no-such-model"])
    bad_shape = module.InferInput("TEXT", [1, 2], "BYTES")
    bad_shape.set_data_from_numpy(np.array([[b"one", b"two"]], dtype=np.object_))
    expect_error(f"{label} bad shape", lambda: client.infer(MODEL, [bad_shape]),
                 "StatusCode.INVALID_ARGUMENT", "400", ["TEXT", "[1, 2]"])
    bad_type = module.InferInput("TEXT", [2], "FP32")
    bad_type.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    expect_error(f"{label} bad datatype", lambda: client.infer(MODEL, [bad_type]),
                 "StatusCode.INVALID_ARGUMENT", "400", ["TEXT", "FP32", "BYTES"])
    expect_error(f"{label} unknown parameter",
                 lambda: client.infer(MODEL, [text_input(module, texts)],
                                      parameters={"poolng": "mean"}),
                 "StatusCode.INVALID_ARGUMENT", "400", ["poolng", "pooling"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc", required=True, help="HOST:PORT of the gRPC server")
    parser.add_argument("--http", required=True, help="HOST:PORT of the HTTP server")
    parser.add_argument("--expected", required=True)
    args = parser.parse_args()
    with open(args.expected) as f:
        expected = json.load(f)
    grpc_client = tgrpc.InferenceServerClient(args.grpc)
    http_client = thttp.InferenceServerClient(args.http, network_timeout=120)
    for label, client, module in (("grpc", grpc_client, tgrpc), ("http", http_client, thttp)):
        check_metadata(label, client, module, expected)
        check_embeddings(label, client, module, expected)
        check_token_ids(label, client, module, expected)
        check_tokens_and_attention(label, client, module, expected)
        check_errors(label, client, module)
    check_embeddings("http json", http_client, thttp, expected, binary=False)
    print("tritonclient: all checks passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
