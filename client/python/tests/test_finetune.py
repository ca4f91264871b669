"""Client.finetune, versions and rollback against the real Trainer service."""
import json

import grpc
import numpy as np
import pytest

import attnserve

PAIRS = [
    ("red running shoes", "lightweight sneakers for jogging in red"),
    ("stainless steel kettle", "electric water boiler made of steel"),
    ("wireless mouse", "bluetooth pointing device for laptops"),
    ("wool winter hat", "warm knitted beanie for cold weather"),
    ("cast iron pan", "heavy skillet for searing steak"),
    ("noise cancelling headphones", "over-ear headset that blocks sound"),
]
PROBE = ["red running shoes", "cast iron pan"]


def test_finetune_commits_a_version_that_serves_and_rollback_restores(client, tmp_path,
                                                                       capsys):
    before = client.versions()
    base = next(v.version for v in before if v.serving)
    base_vectors = client.encode(PROBE)

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in PAIRS))
    result = client.finetune(data, "contrastive", batch_size=3, epochs=2, learning_rate=1e-4,
                             seed=7, description="client test", promote=True,
                             progress=True)
    assert result.steps == 4 and len(result.losses) == 4
    assert all(np.isfinite(result.losses))
    assert result.base_version == base and result.committed_version
    assert "finetune" in capsys.readouterr().err  # the tqdm bar

    after = client.versions()
    assert [v.version for v in after] == [v.version for v in before] + [result.committed_version]
    assert next(v for v in after if v.serving).version == result.committed_version
    assert after[-1].description == "client test"
    tuned = client.encode(PROBE)
    assert not np.allclose(tuned, base_vectors, atol=1e-4)  # the weights moved
    np.testing.assert_allclose(client.encode(PROBE, model_version=base), base_vectors, atol=1e-6)

    # Rollback serves again the version served before, whatever was committed (staged) since.
    restored = client.rollback()
    assert next(v for v in restored if v.serving).version == base
    assert client.model_info().version == base
    client.set_serving_version(base)
    np.testing.assert_allclose(client.encode(PROBE), base_vectors, atol=1e-6)


def test_finetune_from_tuples_without_commit_publishes_nothing(client):
    before = client.versions()
    result = client.finetune(PAIRS[:4], "contrastive", batch_size=2, commit=False,
                             progress=False, seed=1)
    assert result.steps == 2 and result.committed_version == ""
    assert client.versions() == before


def test_finetune_bad_data_is_refused_before_and_by_the_server(client, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"anchor": "a", "positive": "b"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        client.finetune(bad, "contrastive", progress=False)
    with pytest.raises(ValueError, match="objective 'regression'"):
        client.finetune(PAIRS, "regression", progress=False)
    with pytest.raises(ValueError, match="unknown field"):
        client.finetune([{"anchor": "a", "positve": "b"}], "contrastive", progress=False)
    before = client.versions()
    # The server's own check: a classification label outside [0, num_labels).
    with pytest.raises(attnserve.AttnserveError) as e:
        client.finetune([("a text", 0), ("another", 5)], "classification", num_labels=2,
                        progress=False)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert client.versions() == before


HELD_OUT = [{"item": "lightweight sneakers for jogging in red"},
            {"item": "heavy skillet for searing steak"},
            {"item": "warm knitted beanie for cold weather"},
            {"query": "red running shoes", "item": "lightweight sneakers for jogging in red"},
            {"query": "cast iron pan", "item": "heavy skillet for searing steak"},
            {"query": "wool winter hat", "item": "warm knitted beanie for cold weather"}]


def test_evaluate_and_a_gated_finetune_with_its_report(client):
    base = client.evaluate(HELD_OUT, version="base")
    assert base.task == "retrieval" and base.examples == 3
    assert list(base.metrics) == ["mrr@10", "recall@1", "recall@10", "ndcg@10"]
    assert base.per_example.shape == (3,) and np.all(base.per_example >= 1)
    assert base.metrics["recall@1"] == np.mean(base.per_example == 1)

    # A gate that cannot hold: the version is committed staged, saying why.
    result = client.finetune(PAIRS, "contrastive", batch_size=3, epochs=1, learning_rate=1e-5,
                             seed=3, progress=False, eval_data=HELD_OUT, eval_every=1,
                             promote_if="recall@1>1")
    assert [e.step for e in result.evaluations] == [0, 1, 2]
    assert result.evaluations[0].metrics == base.metrics
    assert not result.promoted
    assert result.promotion.startswith("staged: the gate recall@1>1 failed")
    assert not next(v for v in client.versions() if v.version == result.committed_version).serving

    report = client.training_report(result.committed_version)
    assert [e.step for e in report.evaluations] == [0, 1, 2]
    assert [e.metrics for e in report.evaluations] == [e.metrics for e in result.evaluations]
    assert report.promotion == result.promotion
    assert report.losses == pytest.approx(result.losses)
    assert report.settings["objective"] == "contrastive"

    with pytest.raises(attnserve.AttnserveError) as error:
        client.evaluate([{"text": "a kettle", "label": 0}], version="base")
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_batches_follow_attnctl_order_and_never_leave_a_lone_pair():
    from attnserve import _finetune

    # Pinned from engine/training/epoch_order.h's EpochOrder (client_test.cc
    # TrainingData.EpochOrderAndSteps pins the same lists), so Python, attnctl and detached jobs
    # send the same batches for the same data and seed.
    assert _finetune.epoch_order(12, 7, 0) == [1, 0, 8, 4, 5, 2, 3, 6, 11, 7, 10, 9]
    assert _finetune.epoch_order(12, 7, 1) == [1, 4, 10, 6, 5, 0, 8, 11, 2, 7, 9, 3]
    assert _finetune.epoch_order(10, 2**64 - 1, 3) == [8, 0, 3, 4, 9, 1, 5, 6, 2, 7]
    assert _finetune.epoch_batches(9, 4, 2) == [(0, 4), (4, 7), (7, 9)]
    assert _finetune.epoch_batches(9, 4) == [(0, 4), (4, 8), (8, 9)]

    pairs = [tpb_example(a, p) for a, p in PAIRS[:5]]
    sizes = [len(b.examples) for b in _finetune.batches(pairs, 4, 1, True, 3, min_batch=2)]
    assert sizes == [3, 2]
    with pytest.raises(ValueError, match="batch of 1 pair"):
        _finetune.batches(pairs, 2, 1, True, 3, min_batch=2)


def tpb_example(anchor, positive):
    from attnserve.v1 import trainer_pb2 as tpb

    return tpb.TrainingExample(anchor=anchor, positive=positive)
