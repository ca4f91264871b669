"""The Trainer calls at parity with the protos and attnctl, on the test server's second model
("tiny": its jobs train in milliseconds): versions, promote, rollback, set_serving_version,
diff, neighbors, training_report, and server-side jobs (create, list, get, events, watch,
cancel). Weights and vectors are checked against numpy over the safetensors files the server
wrote; every call names the model, and the default model's versions never change."""
import hashlib

import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes

import attnserve
import reference
from attnserve.v1 import trainer_pb2 as tpb
from conftest import SECOND_MODEL, TINY_DIR

TINY = SECOND_MODEL
TINY_HEADS = 2
PAIRS = [("the king", "the queen"), ("king spoke", "queen spoke"),
         ("to the king", "to the queen"), ("the king spoke", "the queen spoke")]
PROBES = ["the king", "the queen", "king spoke", "queen spoke", "to the king", "to the queen",
          "the king spoke", "the queen spoke", "king", "queen", "spoke to the king"]
SETTINGS = dict(batch_size=2, epochs=3, learning_rate=1e-2, seed=11, disable_dropout=True)


def served(client, model=TINY):
    return next(v.version for v in client.versions(model=model) if v.serving)


def version_weights(server, version):
    if version == "base":
        return reference.read_safetensors(TINY_DIR / "model.safetensors")
    (path,) = server.store.glob(f"**/{version}/model.safetensors")
    return reference.read_safetensors(path)


def tiny_embedding(weights, client, text):
    ids = [t.id for t in client.tokenize(text, model=TINY)[0]]
    return reference.sentence_embedding(weights, ids, TINY_HEADS)


@pytest.fixture(scope="module")
def staged(client):
    """A staged version of the tiny model, committed over the FineTune stream."""
    default_versions = client.versions()
    # total_steps: the learning rate decays to 0 at the last step, as a job's does by default.
    result = client.finetune(PAIRS, "contrastive", progress=False, description="tiny staged",
                             total_steps=6, model=TINY, **SETTINGS)
    assert client.versions() == default_versions  # the default model did not change
    return result


@pytest.fixture(scope="module")
def finished_job(client):
    """A server-side job of the tiny model with finetune's settings, created and run to its end
    (the model runs one job at a time: later tests' jobs and streams must not meet it)."""
    job = client.create_job(PAIRS, "contrastive", description="tiny job", model=TINY,
                            **SETTINGS)
    for _ in client.job_events(job.job_id, model=TINY):
        pass
    return job


def test_versions_are_listed_per_model(client, staged):
    versions = client.versions(model=TINY)
    assert versions[0].version == "base" and versions[0].serving
    mine = next(v for v in versions if v.version == staged.committed_version)
    assert mine.staged and not mine.serving and mine.description == "tiny staged"
    assert staged.committed_version not in [v.version for v in client.versions()]


def test_promote_serves_the_version_of_the_named_model(server, client, staged):
    default_before = served(client, model="")
    versions = client.promote(staged.committed_version, model=TINY)
    assert next(v.version for v in versions if v.serving) == staged.committed_version
    assert client.model_info(model=TINY).version == staged.committed_version
    assert served(client, model="") == default_before
    # The served vectors are the committed weights' (numpy over the version's safetensors).
    tuned = version_weights(server, staged.committed_version)
    np.testing.assert_allclose(client.encode("the king spoke", model=TINY)[0],
                               tiny_embedding(tuned, client, "the king spoke"), atol=1e-5)
    client.set_serving_version("base", model=TINY)


def test_rollback_returns_to_the_version_served_before(server, client, staged):
    client.promote(staged.committed_version, model=TINY)
    versions = client.rollback(model=TINY)
    assert next(v.version for v in versions if v.serving) == "base"
    base = version_weights(server, "base")
    np.testing.assert_allclose(client.encode("the queen", model=TINY)[0],
                               tiny_embedding(base, client, "the queen"), atol=1e-5)


def test_set_serving_version_serves_any_committed_version(client, staged):
    versions = client.set_serving_version(staged.committed_version, model=TINY)
    assert next(v.version for v in versions if v.serving) == staged.committed_version
    assert served(client) == staged.committed_version
    client.set_serving_version("base", model=TINY)
    assert served(client) == "base"


def test_diff_relative_changes_equal_numpy_over_the_checkpoints(server, client, staged):
    version = staged.committed_version
    diff = client.diff("base", version, probes=PROBES, model=TINY)
    assert (diff.model, diff.version_a, diff.version_b) == (TINY, "base", version)
    a, b = version_weights(server, "base"), version_weights(server, version)
    for matrix, layer, name in [
            ("word_embeddings", -1, "embeddings.word_embeddings.weight"),
            ("query", 0, "encoder.layer.0.attention.self.query.weight"),
            ("ffn_out", 1, "encoder.layer.1.output.dense.weight")]:
        assert diff.relative_change(matrix, layer) == pytest.approx(
            reference.relative_change(a[name], b[name]), rel=1e-6)
    assert len(diff.heads) == 2 * TINY_HEADS and not diff.default_probes
    js = [h.attention_js for h in diff.most_changed_heads]
    assert js == sorted(js, reverse=True)
    assert diff.drift.probes == len(PROBES) and -1 <= diff.drift.min_cosine <= 1
    same = client.diff("base", "base", probes=PROBES, model=TINY)
    assert all(m.relative_change == 0 for m in same.matrices)
    assert same.can_mix and same.drift.min_cosine == pytest.approx(1.0, abs=1e-6)
    assert same.verdict.startswith("vectors from A can be mixed with B")


def test_neighbors_static_and_contextual_equal_numpy(client):
    vocab = (TINY_DIR / "vocab.txt").read_text().splitlines()
    weights = reference.read_safetensors(TINY_DIR / "model.safetensors")
    sentences = ["the king spoke", "to the king", "the queen spoke to the king"]
    result = client.neighbors("king", version="base", top_k=5, sentences=sentences, model=TINY)
    assert result.word_tokens == ["king"] and result.word_token_ids == [vocab.index("king")]
    table = weights["embeddings.word_embeddings.weight"]
    king = table[vocab.index("king")]
    cosine = table @ king / (np.linalg.norm(table, axis=1) * np.linalg.norm(king))
    cosine[vocab.index("king")] = -np.inf  # its own id left out
    order = np.argsort(-cosine, kind="stable")[:5]
    assert [n.token_id for n in result.static] == list(order)
    assert [n.token for n in result.static] == [vocab[i] for i in order]
    np.testing.assert_allclose([n.cosine for n in result.static], cosine[order], atol=1e-6)
    # Contextual: the cosine of "king"'s last hidden state across the sentences.
    assert result.layer == 2 and result.contextual.shape == (3, 3)
    vectors = []
    for sentence in sentences:
        tokens = client.tokenize(sentence, model=TINY)[0]
        hidden, _ = reference.forward(weights, [t.id for t in tokens], TINY_HEADS)
        vectors.append(hidden[-1][[t.text for t in tokens].index("king")])
    vectors = np.array(vectors) / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(result.contextual, vectors @ vectors.T, atol=1e-5)
    by_id = client.neighbors(token_id=vocab.index("king"), version="base", top_k=5, model=TINY)
    assert by_id.static == result.static


def test_training_report_is_what_the_job_recorded(client, staged):
    report = client.training_report(staged.committed_version, model=TINY)
    assert report.version == staged.committed_version
    assert report.losses == pytest.approx(staged.losses)
    assert report.settings["objective"] == "contrastive"
    assert report.relative_change and all(v >= 0 for v in report.relative_change.values())
    with pytest.raises(attnserve.NotFound):
        client.training_report(staged.committed_version)  # not a version of the default model


def test_create_job_uploads_the_delimited_dataset_and_queues_it(client, finished_job):
    job = finished_job
    assert job.job_id.startswith("job-") and job.model == TINY
    assert job.state in ("pending", "running")  # as created
    assert (job.epochs, job.batch_size, job.total_steps) == (3, 2, 6)
    # The dataset as protobuf's delimited format, written here with protobuf's own varint.
    data = b"".join(_VarintBytes(len(m)) + m for m in (
        tpb.TrainingExample(anchor=a, positive=p).SerializeToString() for a, p in PAIRS))
    assert (job.dataset.examples, job.dataset.bytes, job.dataset.sha256) == (
        len(PAIRS), len(data), hashlib.sha256(data).hexdigest())
    with pytest.raises(ValueError, match="unknown field"):
        client.create_job([{"anchor": "a", "positve": "b"}], "contrastive", model=TINY)
    with pytest.raises(attnserve.InvalidArgument):  # the server's check, before any upload
        client.create_job(PAIRS, "contrastive", batch_size=100000, model=TINY)


def test_job_has_its_spec_and_result(client, finished_job, staged):
    job = client.job(finished_job.job_id, model=TINY)
    assert job.state == "succeeded" and job.ended and job.step == job.total_steps == 6
    assert job.spec.config.model == TINY and job.spec.description == "tiny job"
    assert job.committed_version and not job.promoted
    assert job.committed_version in [v.version for v in client.versions(model=TINY)]
    # The server batches like finetune does: the same data, seed and batch size, the same loss.
    assert job.loss == pytest.approx(staged.losses[-1], rel=1e-4)
    with pytest.raises(attnserve.NotFound, match="model"):
        client.job(finished_job.job_id)  # a job of the tiny model, asked of the default one


def test_jobs_lists_the_named_models_jobs(client, finished_job):
    jobs = client.jobs(model=TINY)
    assert finished_job.job_id in [j.job_id for j in jobs]
    assert jobs.max_queued_jobs > 0 and jobs.queued == 0
    assert next(j for j in jobs if j.job_id == finished_job.job_id).state == "succeeded"
    assert finished_job.job_id not in [j.job_id for j in client.jobs()]


def test_job_events_replay_from_any_event(client, finished_job, staged):
    events = list(client.job_events(finished_job.job_id, model=TINY))
    assert [e.index for e in events] == list(range(len(events)))
    assert events[0].state == "pending" and events[-1].state == "succeeded"
    steps = [e.progress for e in events if e.progress is not None and e.progress.step]
    assert [p.step for p in steps][:6] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([p.loss for p in steps[:6]], staged.losses, rtol=1e-4)
    assert events[-1].progress.committed_version == client.job(
        finished_job.job_id, model=TINY).committed_version
    assert list(client.job_events(finished_job.job_id, from_event=3, model=TINY)) == events[3:]


def test_watch_job_follows_it_to_the_end_with_a_progress_bar(client, finished_job, capsys):
    job = client.watch_job(finished_job.job_id, model=TINY)
    assert job.state == "succeeded" and job.committed_version
    err = capsys.readouterr().err
    assert finished_job.job_id in err and "6/6" in err


def test_cancel_job_stops_it_and_publishes_nothing(client, finished_job):
    before = client.versions(model=TINY)
    job = client.create_job(PAIRS, "contrastive", epochs=100000, batch_size=2, model=TINY)
    cancelled = client.cancel_job(job.job_id, model=TINY)
    assert cancelled.state == "cancelled" and cancelled.ended
    assert cancelled.step < cancelled.total_steps == 200000
    assert client.versions(model=TINY) == before
    with pytest.raises(attnserve.FailedPrecondition):
        client.cancel_job(job.job_id, model=TINY)
