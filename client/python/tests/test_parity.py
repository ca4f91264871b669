"""Parity that cannot drift: every public Client method has its own test, AsyncClient offers each
one as a coroutine with Client's signature, and every call that takes model= sends it (an
unknown model is NotFound naming it, for each). Also the keys: api_key / $ATTNSERVE_API_KEY for
the Encoder, trainer_token / $ATTNSERVE_TOKEN for the Trainer, errors by code with hints."""
import asyncio
import inspect
import pathlib
import re

import grpc
import numpy as np
import pytest

import attnserve
from attnserve.aio import AsyncClient
from conftest import API_KEY, TRAINER_TOKEN

HERE = pathlib.Path(__file__).resolve().parent


def public_methods(cls):
    return sorted(name for name, _ in inspect.getmembers(cls, inspect.isfunction)
                  if not name.startswith("_"))


def test_every_public_method_has_a_test_named_after_it():
    methods = public_methods(attnserve.Client)
    tests = re.findall(r"^def (test_\w+)\(", "".join(
        p.read_text() for p in sorted(HERE.glob("test_*.py"))), flags=re.M)
    covered = set()
    for test in tests:
        # A test covers the longest method its name starts with: test_encode_full_... covers
        # encode_full, not encode.
        named = [m for m in methods if test == f"test_{m}" or test.startswith(f"test_{m}_")]
        if named:
            covered.add(max(named, key=len))
    missing = [m for m in methods if m not in covered]
    assert not missing, (f"public Client methods without a test named test_<method>_...: "
                         f"{missing}")


def test_async_client_offers_every_method_with_clients_signature():
    for name in public_methods(attnserve.Client):
        method = getattr(AsyncClient, name, None)
        assert method is not None, f"AsyncClient has no {name}"
        if name == "close":
            continue
        if name == "job_events":
            assert inspect.isasyncgenfunction(method)
            continue
        assert inspect.iscoroutinefunction(method), name
        assert inspect.signature(method) == inspect.signature(getattr(attnserve.Client, name))


# The least each call needs besides model=: the arguments given to it below.
MINIMAL_ARGUMENTS = {
    "attention": (["a text"], {}),
    "cancel_job": (["job-1"], {}),
    "classify": (["a text"], {}),
    "create_job": ([[("a", "b"), ("c", "d")], "contrastive"], {}),
    "diff": (["base", "base"], {}),
    "encode": (["a text"], {}),
    "encode_full": (["a text"], {}),
    "evaluate": ([[{"query": "q", "item": "i"}]], {}),
    "explain": (["a", "b"], {}),
    "finetune": ([[("a", "b"), ("c", "d")], "contrastive"], {"progress": False}),
    "hidden_states": (["a text", [0]], {}),
    "job": (["job-1"], {}),
    "job_events": (["job-1"], {}),
    "jobs": ([], {}),
    "model_info": ([], {}),
    "neighbors": (["king"], {}),
    "promote": (["base"], {}),
    "rerank": (["q", ["d"]], {}),
    "rollback": ([], {}),
    "set_serving_version": (["base"], {}),
    "sparse": (["a text"], {}),
    "static_embeddings": (["a text"], {}),
    "token_embeddings": (["a text"], {}),
    "tokenize": (["a text"], {}),
    "training_report": (["base"], {}),
    "versions": ([], {}),
    "watch_job": (["job-1"], {"progress": False}),
}


def test_every_call_with_a_model_parameter_sends_it(client):
    with_model = [m for m in public_methods(attnserve.Client)
                  if "model" in inspect.signature(getattr(attnserve.Client, m)).parameters]
    assert sorted(MINIMAL_ARGUMENTS) == with_model
    for name in with_model:
        args, kwargs = MINIMAL_ARGUMENTS[name]
        with pytest.raises(attnserve.NotFound) as e:
            result = getattr(client, name)(*args, model="no-such-model", **kwargs)
            if inspect.isgenerator(result):
                list(result)
        assert "no-such-model" in e.value.message, (name, e.value.message)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_close_ends_the_channel(server):
    with attnserve.Client(server.address, api_key=API_KEY) as c:
        assert c.encode("open").shape == (1, 384)
    with pytest.raises(ValueError, match="closed channel"):
        c.encode("closed")


def test_keys_from_arguments_and_the_environment(server, monkeypatch):
    monkeypatch.delenv("ATTNSERVE_API_KEY", raising=False)
    monkeypatch.delenv("ATTNSERVE_TOKEN", raising=False)
    with attnserve.Client(server.address, api_key=API_KEY) as c:
        assert c.encode("hello").shape == (1, 384)
        with pytest.raises(attnserve.Unauthenticated) as e:
            c.versions()  # the API key is not the trainer token, and none was given
        assert "trainer_token" in e.value.hint and "ATTNSERVE_TOKEN" in str(e.value)
    with attnserve.Client(server.address) as anonymous:
        with pytest.raises(attnserve.Unauthenticated) as e:
            anonymous.encode("hello")
        assert "api_key" in e.value.hint and "ATTNSERVE_API_KEY" in e.value.hint
    with attnserve.Client(server.address, api_key="wrong") as wrong:
        with pytest.raises(attnserve.PermissionDenied) as e:
            wrong.encode("hello")
        assert "--api-key-file" in e.value.hint
    with pytest.raises(TypeError, match="not both"):
        attnserve.Client(server.address, token=API_KEY, api_key=API_KEY)

    monkeypatch.setenv("ATTNSERVE_ADDR", server.address)
    monkeypatch.setenv("ATTNSERVE_API_KEY", API_KEY)
    monkeypatch.setenv("ATTNSERVE_TOKEN", TRAINER_TOKEN)
    with attnserve.Client() as from_env:
        assert from_env.address == server.address
        assert from_env.encode("hello").shape == (1, 384)
        assert from_env.versions()[0].version == "base"


def test_errors_are_subclasses_by_code_with_the_servers_message(client):
    with pytest.raises(attnserve.InvalidArgument) as e:
        client.encode(["fine", ""])
    assert isinstance(e.value, attnserve.AttnserveError) and isinstance(e.value, ValueError)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.message.startswith("inputs[1]") and e.value.hint == ""
    assert str(e.value) == f"INVALID_ARGUMENT: {e.value.message}"
    with pytest.raises(attnserve.NotFound):
        client.encode("x", model_version="no-such-version")
    with pytest.raises(attnserve.FailedPrecondition):
        client.classify("x", model_version="base")
    with attnserve.Client("127.0.0.1:1", timeout=5) as nowhere:
        with pytest.raises(attnserve.Unavailable) as e:
            nowhere.encode("hello")
        assert "127.0.0.1:1" in e.value.hint


def test_async_client_job_events_and_calls_equal_the_sync_client(server, client):
    async def main():
        async with AsyncClient(server.address, api_key=API_KEY, trainer_token=TRAINER_TOKEN,
                               model="tiny") as aclient:
            info, versions, vectors = await asyncio.gather(
                aclient.model_info(), aclient.versions(), aclient.encode(["king", "queen"]))
            job = await aclient.create_job([("the king", "the queen"), ("king", "queen")],
                                           "contrastive", batch_size=2, epochs=2)
            events = [event async for event in aclient.job_events(job.job_id)]
            return info, versions, vectors, job, events

    expected_info = client.model_info(model="tiny")
    expected_versions = client.versions(model="tiny")
    info, versions, vectors, job, events = asyncio.run(main())
    assert info == expected_info and versions == expected_versions
    np.testing.assert_array_equal(vectors, client.encode(["king", "queen"], model="tiny"))
    assert events[-1].state == "succeeded"
    assert events == list(client.job_events(job.job_id, model="tiny"))


def test_bad_arguments_are_refused_before_any_call_quoting_64_bytes(client):
    # Each is refused by the client itself with a message a user can act on, naming the
    # argument and the accepted values, and quoting at most 64 bytes of what was given (as the
    # server quotes: '...'…(N bytes)).
    cases = [
        (lambda: client.encode("x", pooling="p" * 10000), ValueError, "pooling 'ppp"),
        (lambda: client.encode("x", truncation="middle\x07"), ValueError,
         "truncation 'middle\\x07': expected one of right, left, none"),
        (lambda: client.encode_full("x", dtype="int8"), ValueError, "dtype 'int8'"),
        (lambda: client.attention("x", dtype="float64"), ValueError, "dtype 'float64'"),
        (lambda: client.explain("a", "b", baseline="noise"), ValueError, "baseline 'noise'"),
        (lambda: client.rerank("q", ["d"], method="bm25"), ValueError, "method 'bm25'"),
        (lambda: client.finetune([{"anchor": "a", "x" * 5000: "b"}], "contrastive",
                                 progress=False), ValueError, "unknown field(s) 'xxxx"),
        (lambda: client.create_job([("a", "b")], "regression"), ValueError,
         "objective 'regression'"),
        (lambda: client.finetune([("a", "b")], "contrastive", promote_if="recall@1>0.5",
                                 progress=False), ValueError, "promote_if needs eval_data"),
        (lambda: client.evaluate([{"colour": "red"}]), ValueError, "cannot tell the task"),
        (lambda: client.encode(5), TypeError, "not int"),
        (lambda: client.encode([["a", "b", "c"]]), TypeError, "not list"),
        (lambda: client.encode(np.zeros((2, 2, 2), dtype=np.int32)), TypeError, "1-D"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind) as e:
            call()
        assert words in str(e.value), str(e.value)[:300]
        assert len(str(e.value)) < 300, str(e.value)[:300]
    with pytest.raises(ValueError) as e:
        client.encode("x", pooling="p" * 10000)
    assert str(e.value).startswith("pooling '" + "p" * 64 + "'\u2026(10000 bytes): expected")
    # A long unknown model name is the server's to quote: NotFound, still short.
    with pytest.raises(attnserve.NotFound) as e:
        client.encode("x", model="m" * 10000)
    assert len(e.value.message) < 400 and "m" * 65 not in e.value.message
