"""Client.classify and Client.rerank against the real server's Classify and Rerank RPCs.

Heads are trained here through Client.finetune and committed staged (the default), so the other
tests keep seeing the base version as the default; every call pins the version it means.
"""
import grpc
import numpy as np
import pytest

import attnserve

LABELS = ["sports", "food", "weather"]
TRAIN = [
    ("The striker scored twice in the final minutes of the match.", 0),
    ("The tennis champion won the tournament in straight sets.", 0),
    ("Our team lost the basketball game by three points.", 0),
    ("The marathon runner broke the course record.", 0),
    ("The goalkeeper saved a penalty in extra time.", 0),
    ("The cyclist won the mountain stage of the race.", 0),
    ("Simmer the tomato sauce with garlic and basil.", 1),
    ("This bakery sells fresh sourdough bread and croissants.", 1),
    ("Add a pinch of salt to the pasta water.", 1),
    ("The restaurant serves spicy noodles and dumplings.", 1),
    ("Whisk the eggs with sugar until fluffy.", 1),
    ("Grilled salmon with lemon butter is my favourite dinner.", 1),
    ("Heavy rain and strong winds are expected tonight.", 2),
    ("Tomorrow will be sunny with a high of 25 degrees.", 2),
    ("A snow storm is moving across the northern region.", 2),
    ("The forecast calls for fog in the early morning.", 2),
    ("Thunderstorms will bring hail this afternoon.", 2),
    ("Temperatures will drop below freezing overnight.", 2),
]
HELD_OUT = [
    ("The home side won the football derby 3-1.", 0),
    ("She swam the fastest 100 metres of the championship.", 0),
    ("Bake the cake for forty minutes at 180 degrees.", 1),
    ("The soup needs more pepper and fresh herbs.", 1),
    ("Expect showers and cloudy skies all weekend.", 2),
    ("A heat wave will push temperatures above 35 degrees.", 2),
]
# Held-out accuracy the 3-label head must reach after 4 epochs on 18 examples: 5 of 6.
MIN_ACCURACY = 5 / 6

QUERY = "how do I cook pasta"
DOCUMENTS = [
    "The stock market closed higher today.",
    "Boil the spaghetti in salted water for nine minutes.",
    "The striker scored twice in the final.",
    "Pasta recipes: cooking times for penne and fusilli.",
]


@pytest.fixture(scope="module")
def base(client):
    return client.model_info().version


@pytest.fixture(scope="module")
def classifier(client):
    result = client.finetune(TRAIN, "classification", num_labels=3, label_names=LABELS,
                             batch_size=6, epochs=4, learning_rate=2e-4, seed=3,
                             description="client classify test", progress=False)
    return result.committed_version


@pytest.fixture(scope="module")
def cross_encoder(client):
    relevant = [(q, d, 1) for q, d in [
        ("how do I cook pasta", "Boil the spaghetti in salted water for nine minutes."),
        ("weather tomorrow", "Tomorrow will be sunny with a high of 25 degrees."),
        ("football results", "The home side won the football derby 3-1."),
        ("bread recipe", "Knead the dough and let it rise for an hour."),
    ]]
    irrelevant = [(q, d, 0) for q, d in [
        ("how do I cook pasta", "The stock market closed higher today."),
        ("weather tomorrow", "Whisk the eggs with sugar until fluffy."),
        ("football results", "A snow storm is moving across the region."),
        ("bread recipe", "The goalkeeper saved a penalty in extra time."),
    ]]
    result = client.finetune(relevant + irrelevant, "pair_classification", num_labels=2,
                             batch_size=8, epochs=3, learning_rate=1e-4, seed=5,
                             progress=False)
    return result.committed_version


def test_classify_returns_the_trained_named_labels(client, classifier):
    results = client.classify([text for text, _ in HELD_OUT], model_version=classifier)
    assert len(results) == len(HELD_OUT)
    for scores in results:
        assert sorted(s.label for s in scores) == [0, 1, 2]
        assert [s.name for s in sorted(scores, key=lambda s: s.label)] == LABELS
        probabilities = [s.probability for s in scores]
        assert probabilities == sorted(probabilities, reverse=True)  # most probable first
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)
        # The probabilities are the softmax of the logits.
        logits = np.array([s.logit for s in scores])
        softmax = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose(probabilities, softmax, atol=1e-5)
    correct = sum(scores[0].label == label for scores, (_, label) in zip(results, HELD_OUT))
    assert correct / len(HELD_OUT) >= MIN_ACCURACY, [s[0].name for s in results]
    top1 = client.classify(HELD_OUT[0][0], top_k=1, model_version=classifier)[0]
    assert len(top1) == 1 and top1[0] == results[0][0]


def test_classify_without_a_head_names_the_version(client, base):
    with pytest.raises(attnserve.AttnserveError) as e:
        client.classify(["a text"], model_version=base)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert base in e.value.message


def test_rerank_cosine_equals_numpy_cosine_of_the_embeddings(client, base):
    ranking = client.rerank(QUERY, DOCUMENTS, model_version=base)
    assert ranking.method == "cosine"  # auto on a version without a pair head
    q = client.encode(QUERY, model_version=base)[0]
    d = client.encode(DOCUMENTS, model_version=base)
    cosine = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    assert [h.index for h in ranking.hits] == list(np.argsort(-cosine, kind="stable"))
    np.testing.assert_allclose([h.score for h in ranking.hits], np.sort(cosine)[::-1],
                               atol=1e-5)
    assert ranking.hits[0].index in (1, 3)  # a pasta document

    top = client.rerank(QUERY, DOCUMENTS, top_n=2, return_documents=True, method="cosine",
                        model_version=base)
    assert [h.index for h in top.hits] == [h.index for h in ranking.hits[:2]]
    assert all(h.document == DOCUMENTS[h.index] for h in top.hits)


def test_rerank_cross_encoder_scores_are_the_pair_heads_probability(client, base,
                                                                    cross_encoder):
    ranking = client.rerank(QUERY, DOCUMENTS, method="cross_encoder",
                            model_version=cross_encoder)
    assert ranking.method == "cross_encoder"
    assert ranking.model_version == cross_encoder
    assert client.rerank(QUERY, DOCUMENTS, model_version=cross_encoder).method == "cross_encoder"
    scores = [h.score for h in ranking.hits]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)
    classified = client.classify([(QUERY, d) for d in DOCUMENTS], model_version=cross_encoder)
    relevant = [next(s.probability for s in c if s.label == 1) for c in classified]
    for hit in ranking.hits:
        assert hit.score == pytest.approx(relevant[hit.index], abs=1e-5)

    with pytest.raises(attnserve.AttnserveError) as e:
        client.rerank(QUERY, DOCUMENTS, method="cross_encoder", model_version=base)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert base in e.value.message


def test_rerank_refuses_bad_input(client, base):
    with pytest.raises(attnserve.AttnserveError) as e:
        client.rerank(QUERY, [], model_version=base)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(attnserve.AttnserveError) as e:
        client.rerank(QUERY, ["fine", ""], model_version=base)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ValueError, match="method 'bm25'"):
        client.rerank(QUERY, DOCUMENTS, method="bm25")
