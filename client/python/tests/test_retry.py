"""The client's retry policy (issue 35): behind a load balancer a replica that dies or drains
answers UNAVAILABLE, and a call that only reads is sent again (up to 5 attempts, 0.1 .. 1 s
apart), while a call that changes state (Promote, FineTune, ...) never is.

The peer is an in-process gRPC server that answers UNAVAILABLE a set number of times and then a
fixed reply, counting the attempts it receives: the real server cannot be made to fail on cue,
and what is under test is the client's channel configuration (_base.RETRY_SERVICE_CONFIG), not
the server. deploy/replicas_test.py checks the same policy end to end (SIGKILL behind HAProxy).
"""
import concurrent.futures
import threading

import grpc
import pytest

import attnserve
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import trainer_pb2 as tpb


class FlakyMethod:
    """Answers `code` for the first `failures` attempts, then `reply`; counts the attempts."""

    def __init__(self, reply, failures=0, code=grpc.StatusCode.UNAVAILABLE):
        self.reply, self.failures, self.code = reply, failures, code
        self.attempts = 0
        self._lock = threading.Lock()

    def __call__(self, request, context):
        with self._lock:
            self.attempts += 1
            attempt = self.attempts
        if attempt <= self.failures:
            context.abort(self.code, f"attempt {attempt}: the replica is going away")
        return self.reply


@pytest.fixture
def peer():
    """(address, methods): methods["Encode"], ["ListVersions"], ["Promote"] are FlakyMethods the
    test sets up before calling."""
    methods = {
        "Encode": FlakyMethod(pb.EncodeResponse(results=[pb.EncodeResult(embedding=[0.6, 0.8])])),
        "ListVersions": FlakyMethod(tpb.ListVersionsResponse()),
        "Promote": FlakyMethod(tpb.ListVersionsResponse()),
    }

    def handler(name, request_type, response_type):
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: methods[name](request, context),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString)

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler("attnserve.v1.Encoder", {
            "Encode": handler("Encode", pb.EncodeRequest, pb.EncodeResponse)}),
        grpc.method_handlers_generic_handler("attnserve.v1.Trainer", {
            "ListVersions": handler("ListVersions", tpb.ListVersionsRequest,
                                    tpb.ListVersionsResponse),
            "Promote": handler("Promote", tpb.PromoteRequest, tpb.ListVersionsResponse)}),
    ])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", methods
    server.stop(None)


def test_a_read_is_sent_again_until_answered(peer):
    address, methods = peer
    methods["Encode"].failures = 2
    with attnserve.Client(address, timeout=30) as client:
        embedding = client.encode("hello")
    assert embedding.shape == (1, 2)
    assert methods["Encode"].attempts == 3


def test_a_read_gives_up_after_five_attempts(peer):
    address, methods = peer
    methods["Encode"].failures = 100
    with attnserve.Client(address, timeout=30) as client:
        with pytest.raises(attnserve.AttnserveError) as error:
            client.encode("hello")
    assert "UNAVAILABLE" in str(error.value)
    assert methods["Encode"].attempts == 5


def test_only_unavailable_is_retried(peer):
    address, methods = peer
    methods["Encode"].failures = 100
    methods["Encode"].code = grpc.StatusCode.INTERNAL
    with attnserve.Client(address, timeout=30) as client:
        with pytest.raises(attnserve.AttnserveError):
            client.encode("hello")
    assert methods["Encode"].attempts == 1


def test_trainer_queries_are_retried_and_changes_are_not(peer):
    address, methods = peer
    methods["ListVersions"].failures = 2
    methods["Promote"].failures = 100
    with attnserve.Client(address, timeout=30, trainer_token="t") as client:
        client.versions()
        with pytest.raises(attnserve.AttnserveError):
            client.promote("ft-1")
    assert methods["ListVersions"].attempts == 3
    assert methods["Promote"].attempts == 1
