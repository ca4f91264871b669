"""The Encoder calls at parity with the protos and attnctl, against the two-model test server:
model= routes a call to the named model ("tiny", checked against a numpy forward pass over its
safetensors file), and every Encode/AttentionMap option comes back as numpy arrays equal to a
reference computed from other outputs or from the weights."""
import os
import warnings

import numpy as np
import pytest

import attnserve
import reference
from conftest import API_KEY, DEFAULT_MODEL, ROOT, SECOND_HIDDEN, SECOND_MODEL, TINY_DIR

TINY = SECOND_MODEL
TINY_HEADS = 2
TINY_TEXTS = ["the king spoke to the queen", "the queen spoke", "king"]


@pytest.fixture(scope="module")
def tiny_weights():
    return reference.read_safetensors(TINY_DIR / "model.safetensors")


def tiny_forward(weights, tokens):
    return reference.forward(weights, [t.id for t in tokens], TINY_HEADS)


def test_models_lists_both_models_the_default_first(client):
    models = client.models()
    assert [m.name for m in models] == [DEFAULT_MODEL, TINY]
    assert [m.is_default for m in models] == [True, False]
    assert [m.hidden_size for m in models] == [384, SECOND_HIDDEN]
    assert all(isinstance(m, attnserve.ModelInfo) for m in models)


def test_model_info_answers_for_the_named_model(server, client):
    info = client.model_info()
    assert (info.name, info.hidden_size, info.num_layers, info.is_default) == (
        DEFAULT_MODEL, 384, 6, True)
    assert info.version in info.available_versions
    tiny = client.model_info(model=TINY)
    assert (tiny.name, tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.vocab_size,
            tiny.is_default) == (TINY, SECOND_HIDDEN, 2, TINY_HEADS, 113, False)
    # A client-wide default model, overridden per call (model="" = the server's default).
    with attnserve.Client(server.address, api_key=API_KEY, model=TINY) as tiny_client:
        assert tiny_client.model_info().name == TINY
        assert tiny_client.encode("king").shape == (1, SECOND_HIDDEN)
        assert tiny_client.model_info(model="").name == DEFAULT_MODEL


def test_health_reports_serving_for_the_server_and_the_encoder(client):
    assert client.health() == "SERVING"
    assert client.health("attnserve.v1.Encoder") == "SERVING"
    assert client.health("no.such.Service") == "SERVICE_UNKNOWN"
    assert client.health("x" * 200) == "SERVICE_UNKNOWN"  # a length of two varint bytes


def test_encode_with_model_is_the_named_models_numpy_forward(client, tiny_weights):
    vectors = client.encode(TINY_TEXTS, model=TINY)
    assert vectors.shape == (len(TINY_TEXTS), SECOND_HIDDEN) and vectors.dtype == np.float32
    for row, tokens in zip(vectors, client.tokenize(TINY_TEXTS, model=TINY)):
        expected = reference.sentence_embedding(tiny_weights, [t.id for t in tokens], TINY_HEADS)
        np.testing.assert_allclose(row, expected, atol=1e-5)
    assert client.encode(TINY_TEXTS[0]).shape == (1, 384)  # no model=: the default model


def test_encode_takes_numpy_texts_and_token_ids(client):
    texts = np.array(["The king spoke to the queen.", "A quick brown fox."])
    vectors = client.encode(texts)
    np.testing.assert_array_equal(vectors, client.encode(list(texts)))
    # Token ids as the tokenizer makes them ([CLS] ... [SEP]) are the same input as the text.
    ids = [np.array([t.id for t in tokens]) for tokens in client.tokenize(list(texts))]
    np.testing.assert_allclose(client.encode(ids), vectors, atol=1e-6)
    np.testing.assert_allclose(client.encode(ids[0]), vectors[:1], atol=1e-6)
    pair = ("The king spoke.", "The queen listened.")
    pair_tokens = client.tokenize(pair)[0]
    as_ids = attnserve.TokenIds([t.id for t in pair_tokens], [t.type_id for t in pair_tokens])
    np.testing.assert_allclose(client.encode(as_ids), client.encode([pair]), atol=1e-6)
    with pytest.raises(TypeError, match="1-D sequence of integers"):
        client.encode(np.array([1.5, 2.5]))


def test_encode_warns_when_an_input_was_cut_to_max_length(client):
    long_text = "word " * 300
    with pytest.warns(attnserve.TruncationWarning,
                      match=r"inputs\[1\] has 302 tokens, more than max_length 256"):
        vectors = client.encode(["short", long_text])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chosen truncation, or nothing cut: no warning
        np.testing.assert_array_equal(client.encode(["short", long_text], truncation="right"),
                                      vectors)
        client.encode(["short", "word " * 200])


def test_encode_full_returns_every_output_of_encode(client):
    long_text = " ".join(["word"] * 300)
    texts = ["The king spoke to the queen.", long_text]
    full = client.encode_full(texts, sparse=True, token_embeddings=True, static_embeddings=True,
                              hidden_layers=[0, -1])
    assert len(full) == 2 and isinstance(full[0], attnserve.EncodedInput)
    np.testing.assert_array_equal(full.embeddings, client.encode(texts, truncation="right"))
    assert full.model_version == client.model_info().version
    short, cut = full.inputs
    # Truncation is reported per input, with the length the tokenizer gives without a limit.
    assert not short.truncated
    assert cut.truncated and len(cut.tokens) == 256
    assert cut.untruncated_length == len(client.tokenize(long_text, max_length=512)[0]) == 302
    for item, sparse in zip(full.inputs, client.sparse(texts)):
        t = len(item.tokens)
        assert item.token_embeddings.shape == item.static_embeddings.shape == (t, 384)
        assert item.hidden_states.shape == (2, t, 384) and item.hidden_layers == [0, 6]
        np.testing.assert_array_equal(item.hidden_states[1], item.token_embeddings)
        pooled = item.token_embeddings.mean(axis=0)  # the model's mean pooling, normalised
        np.testing.assert_allclose(item.embedding, pooled / np.linalg.norm(pooled), atol=1e-5)
        np.testing.assert_array_equal(item.sparse.indices, sparse.indices)
        np.testing.assert_array_equal(item.sparse.values, sparse.values)
    assert [t.token_count for t in full.timings] == [len(short.tokens) + len(cut.tokens)]
    # Half precision on the wire: the same tensors to float16's precision.
    half = client.encode_full(texts[:1], token_embeddings=True, dtype="float16")
    np.testing.assert_allclose(half[0].token_embeddings, short.token_embeddings, atol=2e-3,
                               rtol=2e-3)
    tiny = client.encode_full(TINY_TEXTS[:1], hidden_layers=[-1], model=TINY)
    assert tiny.embeddings.shape == (1, SECOND_HIDDEN) and tiny[0].hidden_layers == [2]


def test_sparse_is_bm42_of_the_cls_attention_row(client):
    # Two words that are one word piece each and their own stems: each entry's value is
    # sqrt(log(1 + w)), w the last layer's [CLS] attention to the word averaged over heads.
    text = "red car"
    (vector,) = client.sparse(text)
    assert vector.indices.dtype == np.uint32 and vector.values.dtype == np.float32
    assert list(vector.indices) == sorted(vector.indices) and len(vector.indices) == 2
    maps = client.attention(text, layers=[-1])
    assert maps.labels == ["[CLS]", "red", "car", "[SEP]"]
    weights = maps.weights[0, :, 0, 1:3].mean(axis=0)
    np.testing.assert_allclose(sorted(vector.values), sorted(np.sqrt(np.log1p(weights))),
                               atol=1e-5)
    assert vector.as_dict() == {"indices": vector.indices.tolist(),
                                "values": vector.values.tolist()}
    # Stop words and punctuation carry no entry.
    assert len(client.sparse("the red car, and the")[0].indices) == 2


def test_token_embeddings_of_the_named_model_are_its_last_hidden_states(client, tiny_weights):
    for states in client.token_embeddings(TINY_TEXTS[:2], model=TINY):
        hidden, _ = tiny_forward(tiny_weights, states.tokens)
        np.testing.assert_allclose(states.values, hidden[-1], atol=1e-5)


def test_static_embeddings_are_word_plus_position_plus_type(client, tiny_weights):
    pair = ("the king", "the queen")
    (states,) = client.static_embeddings(pair, model=TINY)
    assert [t.type_id for t in states.tokens] == [0, 0, 0, 0, 1, 1, 1]
    expected = reference.static_embeddings(tiny_weights, [t.id for t in states.tokens],
                                           [t.type_id for t in states.tokens])
    np.testing.assert_allclose(states.values, expected, atol=1e-6)
    # The default model, from its own safetensors file.
    model_dir = os.environ.get("ATTN_MODEL_DIR") or str(ROOT / "models" / "all-MiniLM-L6-v2")
    names = {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "embeddings.token_type_embeddings.weight"}
    minilm = reference.read_safetensors(os.path.join(model_dir, "model.safetensors"), names)
    (states,) = client.static_embeddings("The cat sat.")
    expected = reference.static_embeddings(minilm, [t.id for t in states.tokens])
    np.testing.assert_allclose(states.values, expected, atol=1e-6)


def test_hidden_states_of_the_named_model_match_numpy(client, tiny_weights):
    for states in client.hidden_states(TINY_TEXTS, layers=[0, 1, -1], model=TINY):
        assert states.layers == [0, 1, 2]
        hidden, _ = tiny_forward(tiny_weights, states.tokens)
        np.testing.assert_allclose(states.values, hidden, atol=1e-5)


def test_attention_options_match_numpy(client, tiny_weights):
    text = TINY_TEXTS[0]
    maps = client.attention(text, scores=True, qkv=True, mean=True, rollout=True, model=TINY)
    t = len(maps.tokens)
    assert maps.layers == [0, 1] and maps.heads == [0, 1]
    assert maps.model_version == client.model_info(model=TINY).version
    _, expected = tiny_forward(tiny_weights, maps.tokens)
    np.testing.assert_allclose(maps.weights, expected, atol=1e-5)
    assert maps.query.shape == maps.key.shape == maps.value.shape == (2, TINY_HEADS, t, 4)
    np.testing.assert_allclose(maps.scores, maps.query @ maps.key.transpose(0, 1, 3, 2) / 2.0,
                               atol=1e-5)
    np.testing.assert_allclose(maps.mean_weights, maps.weights.mean(axis=1), atol=1e-6)
    rollout = np.eye(t)  # Abnar & Zuidema: R = A'_1 A'_0, A'_l = (mean_h A_l + I) / 2
    for layer in range(2):
        rollout = (0.5 * maps.weights[layer].mean(axis=0) + 0.5 * np.eye(t)) @ rollout
    np.testing.assert_allclose(maps.rollout, rollout, atol=1e-5)

    top = client.attention(text, layers=[-1], heads=[1], top_k=3, model=TINY)
    assert top.weights is None and top.top_k_weights.shape == (1, 1, t, 3)
    dense = maps.weights[1, 1]
    np.testing.assert_allclose(top.top_k_weights[0, 0], -np.sort(-dense, axis=-1)[:, :3],
                               atol=1e-6)
    picked = np.take_along_axis(dense, top.top_k_indices[0, 0], axis=-1)
    np.testing.assert_allclose(picked, top.top_k_weights[0, 0], atol=1e-6)


def test_tokenize_with_model_uses_that_models_vocabulary(client):
    # vocab.txt's line numbers; a token listed twice ("##s") has its last line's, as Hugging
    # Face's load_vocab gives.
    vocab = {token: i for i, token in
             enumerate((TINY_DIR / "vocab.txt").read_text().splitlines())}
    (tokens,) = client.tokenize("The kings spoke", model=TINY)
    assert [t.text for t in tokens] == ["[CLS]", "the", "king", "##s", "spoke", "[SEP]"]
    assert [t.id for t in tokens] == [vocab[t.text] for t in tokens]
    assert [(t.char_start, t.char_end, t.byte_start, t.byte_end) for t in tokens[1:3]] == [
        (0, 3, 0, 3), (4, 8, 4, 8)]
    assert [t.source for t in tokens] == [-1, 0, 0, 0, 0, -1]
    # The default model's vocabulary has "kings".
    assert [t.text for t in client.tokenize("The kings spoke")[0]][2] == "kings"


def test_explain_attributions_add_up_to_the_similarity(client):
    query, document = "A man is playing a guitar.", "Someone plays the guitar on stage."
    (ig,) = client.explain(query, document, method="integrated_gradients", steps=16,
                           word_level=True)
    a, b = client.encode([query, document])
    assert ig.similarity == pytest.approx(float(a @ b), abs=1e-5)
    assert [t.text for t in ig.query_tokens] == [t.text for t in client.tokenize(query)[0]]
    assert ig.query.integrated_gradients.shape == (len(ig.query_tokens),)
    assert ig.pair_matrix is None
    gain = ig.similarity - ig.query.baseline_similarity
    assert abs(float(ig.query.integrated_gradients.sum()) - gain) <= ig.completeness_error + 1e-5
    # Words sum their pieces' attributions and cover the text they came from.
    guitar = next(w for w in ig.query_words if w.text == "guitar")
    assert query[guitar.char_start:guitar.char_end] == "guitar"
    pieces = ig.query.integrated_gradients[guitar.first_token:guitar.first_token +
                                           guitar.num_tokens]
    assert guitar.integrated_gradients == pytest.approx(float(pieces.sum()), abs=1e-5)

    # Pairwise on the small model: the pair matrix adds up to its target within the error.
    pairwise = client.explain("the king spoke", ["the queen spoke", "king"], steps=8,
                              model=TINY)
    assert len(pairwise) == 2
    for result, document in zip(pairwise, ["the queen spoke", "king"]):
        q, d = client.encode(["the king spoke", document], model=TINY)
        assert result.similarity == pytest.approx(float(q @ d), abs=1e-5)
        assert result.pair_matrix.shape == (len(result.query_tokens),
                                            len(result.document_tokens))
        assert abs(float(result.pair_matrix.sum()) - result.completeness_target) == \
            pytest.approx(result.completeness_error, abs=1e-4)
        top = result.top_pairs(3)
        assert [v for _, _, v in top] == sorted((v for _, _, v in top), reverse=True)
        assert top[0][2] == pytest.approx(float(result.pair_matrix.max()))
    with pytest.raises(ValueError, match="method 'shap'"):
        client.explain("a", "b", method="shap")


def test_long_text_chunk_embeds_all_of_a_long_text(client):
    # Reference, from the README's rule and independent of the server's chunking code: the
    # text's ids without [CLS]/[SEP], windows of W = max_length - 2 ids at stride W - overlap
    # (the last the first to reach the end), each encoded alone as [CLS] window [SEP] with
    # normalize off, their mean weighted by window length + 2, then L2-normalised.
    # WordPiece starts afresh at every space: the text's ids are its sentences' ids in a row.
    sentences = [f"sentence {i} says the river floods the town every spring." for i in range(60)]
    text = " ".join(sentences)
    ids = [t.id for tokens in client.tokenize(sentences) for t in tokens if not t.special]
    max_length, overlap = 64, 16
    width, stride = max_length - 2, max_length - 2 - overlap
    starts = [0]
    while starts[-1] + width < len(ids):
        starts.append(starts[-1] + stride)
    spans = [(s, min(s + width, len(ids))) for s in starts]
    cls, sep = 101, 102
    windows = [np.array([cls] + ids[a:b] + [sep], dtype=np.int64) for a, b in spans]
    pooled = client.encode(windows, normalize=False).astype(np.float64)
    weights = np.array([b - a + 2 for a, b in spans], dtype=np.float64)
    expected = (pooled * weights[:, None]).sum(0) / weights.sum()
    expected /= np.linalg.norm(expected)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is cut: no TruncationWarning
        vector = client.encode(text, max_length=max_length, long_text="chunk",
                               chunk_overlap=overlap)
    np.testing.assert_allclose(vector[0], expected, atol=1e-5)
    full = client.encode_full(["short", text], max_length=max_length, long_text="chunk",
                              chunk_overlap=overlap)
    assert [i.chunks for i in full.inputs] == [1, len(spans)]
    assert len(spans) > 3 and not full.inputs[1].truncated
    with pytest.raises(ValueError, match="long_text 'all'"):
        client.encode(text, long_text="all")
    with pytest.raises(attnserve.InvalidArgument, match="chunk_overlap"):
        client.encode(text, max_length=max_length, long_text="chunk", chunk_overlap=62)
