"""attnserve.Client against a real server: each result checked against the raw gRPC answer or a
numpy reference computed from other outputs of the server (pooling, softmax, truncation)."""
import grpc
import numpy as np
import pytest

import attnserve
from attnserve import _convert
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from conftest import API_KEY, MAX_INPUTS_PER_REQUEST

TEXTS = [
    "The king spoke to the queen.",
    "A quick brown fox jumps over the lazy dog.",
    "Embeddings map sentences to vectors.",
    "Rain is expected in Paris tomorrow afternoon.",
]
HIDDEN = 384  # all-MiniLM-L6-v2


def raw_encode(server, request):
    with grpc.insecure_channel(server.address) as channel:
        return encoder_pb2_grpc.EncoderStub(channel).Encode(
            request, metadata=[("authorization", f"Bearer {API_KEY}")], timeout=120)


def test_encode_is_float32_rows_equal_to_grpc_encode(server, client):
    vectors = client.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), HIDDEN)
    assert vectors.dtype == np.float32
    raw = raw_encode(server, pb.EncodeRequest(inputs=[pb.Input(text=t) for t in TEXTS]))
    expected = np.array([list(r.embedding) for r in raw.results], dtype=np.float32)
    np.testing.assert_array_equal(vectors, expected)
    # all-MiniLM-L6-v2 normalises by default.
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_encode_equals_numpy_mean_pooling_of_token_embeddings(client):
    vectors = client.encode(TEXTS, normalize=False)
    for vector, states in zip(vectors, client.token_embeddings(TEXTS)):
        reference = states.values.mean(axis=0)  # the model's pooling: mean over all tokens
        np.testing.assert_allclose(vector, reference, atol=1e-5)


def test_dimensions_is_the_renormalised_prefix(client):
    full = client.encode(TEXTS)
    short = client.encode(TEXTS, dimensions=64)
    assert short.shape == (len(TEXTS), 64)
    reference = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, reference, atol=1e-6)


def test_long_lists_are_split_across_requests(client):
    texts = [f"sentence number {i} about {TEXTS[i % len(TEXTS)]}" for i in range(19)]
    assert len(texts) > 2 * MAX_INPUTS_PER_REQUEST
    vectors = client.encode(texts)
    assert vectors.shape == (19, HIDDEN)
    for i in (0, 9, 18):
        np.testing.assert_allclose(vectors[i], client.encode([texts[i]])[0], atol=1e-5)
    assert len(client.tokenize(texts)) == 19


def test_pairs_and_tokens(client):
    tokens = client.tokenize(("The king spoke.", "The queen listened."))[0]
    labels = [t.text for t in tokens]
    assert labels[0] == "[CLS]" and labels[-1] == "[SEP]" and labels.count("[SEP]") == 2
    second = labels.index("[SEP]") + 1
    assert all(t.type_id == 0 for t in tokens[:second])
    assert all(t.type_id == 1 for t in tokens[second:])
    king = labels.index("king")
    assert "The king spoke."[tokens[king].char_start:tokens[king].char_end] == "king"
    assert client.encode([("The king spoke.", "The queen listened.")]).shape == (1, HIDDEN)


def test_token_and_hidden_states(client):
    states = client.token_embeddings(TEXTS[:2])
    tokens = client.tokenize(TEXTS[:2])
    layers = client.hidden_states(TEXTS[:2], layers=[0, -1])
    for s, t, h in zip(states, tokens, layers):
        assert s.values.shape == (len(t), HIDDEN) and s.values.dtype == np.float32
        assert s.labels == [x.text for x in t]
        assert h.values.shape == (2, len(t), HIDDEN)
        assert h.layers == [0, 6]
        # The last layer's hidden states are the token embeddings.
        np.testing.assert_allclose(h.values[1], s.values, atol=1e-6)
    static = client.static_embeddings(TEXTS[0])[0]
    assert static.values.shape == states[0].values.shape
    assert not np.allclose(static.values, layers[0].values[0], atol=1e-3)  # before LayerNorm


def test_attention_is_the_softmax_of_the_scores(client):
    text = "The cat sat on the mat because it was tired."
    maps = client.attention(text, layers=[0, -1], heads=[0, 3], scores=True)
    t = len(client.tokenize(text)[0])
    assert maps.weights.shape == (2, 2, t, t) and maps.weights.dtype == np.float32
    assert maps.layers == [0, 5] and maps.heads == [0, 3]
    assert maps.labels == [x.text for x in client.tokenize(text)[0]]
    np.testing.assert_allclose(maps.weights.sum(axis=-1), 1.0, atol=1e-5)
    e = np.exp(maps.scores - maps.scores.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(maps.weights, e / e.sum(axis=-1, keepdims=True), atol=1e-5)
    everything = client.attention(text)
    assert everything.weights.shape == (6, 12, t, t)
    np.testing.assert_allclose(everything.weights[5, 3], maps.weights[1, 1], atol=1e-6)


def test_truncation(client):
    long_text = " ".join(["word"] * 50)
    assert len(client.tokenize(long_text, max_length=16)[0]) == 16
    with pytest.raises(attnserve.AttnserveError) as e:
        client.encode(long_text, max_length=16, truncation="none")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ValueError, match="truncation 'middle'"):
        client.encode(long_text, truncation="middle")


def test_errors_are_one_exception_with_code_and_message(server, client):
    with pytest.raises(attnserve.AttnserveError) as e:
        client.encode(["fine", ""])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "1" in e.value.message  # names the input index
    assert str(e.value).startswith("INVALID_ARGUMENT: ")

    with pytest.raises(attnserve.AttnserveError) as e:
        client.encode(TEXTS, model_version="no-such-version")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "no-such-version" in e.value.message

    with attnserve.Client(server.address) as anonymous:
        with pytest.raises(attnserve.AttnserveError) as e:
            anonymous.encode(TEXTS)
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with attnserve.Client(server.address, token=API_KEY, trainer_token="wrong") as wrong:
        with pytest.raises(attnserve.AttnserveError) as e:
            wrong.versions()
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED

    with attnserve.Client("127.0.0.1:1", timeout=5) as nowhere:
        with pytest.raises(attnserve.AttnserveError) as e:
            nowhere.encode("hello")
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
    # The server keeps serving.
    assert client.encode("still serving").shape == (1, HIDDEN)


def test_tensor_decoding_of_half_precision_dtypes():
    values = np.array([[1.5, -2.25, 3.0e-3], [65504.0, 0.0, -1.0]], dtype=np.float32)
    half = pb.Tensor(shape=[2, 3], dtype=pb.FLOAT16, data=values.astype("<f2").tobytes())
    np.testing.assert_array_equal(_convert.tensor(half), values.astype(np.float16))
    # bfloat16 = the upper 16 bits of float32 (these values are exact in bfloat16 except 3e-3).
    upper = (values.view(np.uint32) >> 16).astype("<u2")
    bf16 = pb.Tensor(shape=[2, 3], dtype=pb.BFLOAT16, data=upper.tobytes())
    expected = (upper.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(_convert.tensor(bf16), expected)
    np.testing.assert_allclose(_convert.tensor(bf16), values, rtol=1e-2)


def test_async_client_runs_calls_concurrently_with_the_same_results(server, client):
    import asyncio

    from attnserve.aio import AsyncClient

    async def main():
        async with AsyncClient(server.address, token=API_KEY) as aclient:
            rows = await asyncio.gather(*(aclient.encode([t]) for t in TEXTS))
            maps = await aclient.attention(TEXTS[0], layers=[-1])
            with pytest.raises(attnserve.AttnserveError) as e:
                await aclient.encode([""])
            return rows, maps, e.value.code

    rows, maps, code = asyncio.run(main())
    np.testing.assert_allclose(np.concatenate(rows), client.encode(TEXTS), atol=1e-5)
    np.testing.assert_array_equal(maps.weights, client.attention(TEXTS[0], layers=[-1]).weights)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
