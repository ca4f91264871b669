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

    # Rollback serves the version committed before (base, unless other tests committed some).
    restored = client.rollback()
    assert next(v for v in restored if v.serving).version == after[-2].version
    assert client.model_info().version == after[-2].version
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
