"""The connection a Client holds: channel, credentials, metadata, and turning gRPC errors into the
package's exceptions with advice for the cases a client can fix itself."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, List, Optional, Tuple, Union

import grpc

from attnserve.errors import AttnserveError
from attnserve.v1 import encoder_pb2_grpc
from attnserve.v1 import trainer_pb2_grpc

DEFAULT_ADDRESS = "localhost:50051"
# tls: False (plain TCP), True (the system's trusted roots), a CA certificate as PEM bytes or a
# path to a PEM file, or ready-made grpc.ChannelCredentials.
TlsOption = Union[bool, bytes, str, grpc.ChannelCredentials]

_ENCODER_HINTS = {
    grpc.StatusCode.UNAUTHENTICATED:
        "the server runs with --api-key-file: pass Client(api_key=...) or set ATTNSERVE_API_KEY",
    grpc.StatusCode.PERMISSION_DENIED:
        "wrong key: compare api_key / $ATTNSERVE_API_KEY with the server's --api-key-file",
}
_TRAINER_HINTS = {
    grpc.StatusCode.UNAUTHENTICATED:
        "the Trainer needs its token: pass Client(trainer_token=...) or set ATTNSERVE_TOKEN",
    grpc.StatusCode.PERMISSION_DENIED:
        "wrong token: compare trainer_token / $ATTNSERVE_TOKEN with the server's "
        "--trainer-token-file",
    grpc.StatusCode.UNIMPLEMENTED:
        "this server has no Trainer service (start it with --trainer-token-file)",
}


def channel_credentials(tls: TlsOption) -> Optional[grpc.ChannelCredentials]:
    if tls is False or tls is None:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, str):
        with open(tls, "rb") as f:
            tls = f.read()
    return grpc.ssl_channel_credentials(root_certificates=tls)


# gRPC's retry policy for the calls that only read (every Encoder call, the Open Inference
# Protocol's, the Trainer's queries): a call answered UNAVAILABLE (a replica that died or is
# draining behind a load balancer, a refused connection) is sent again, up to 5 attempts in
# about 1.5 s. Calls that change state (FineTune, Promote, Rollback, ...) are never retried.
# attnctl and the C++ client carry the same policy (client/client.cc).
_READ_ONLY_TRAINER_CALLS = ("ListVersions", "CompareVersions", "Neighbors", "GetTrainingReport",
                            "Evaluate", "GetJob", "ListJobs", "WatchJob")
RETRY_SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "attnserve.v1.Encoder"},
                 {"service": "inference.GRPCInferenceService"}] +
                [{"service": "attnserve.v1.Trainer", "method": m}
                 for m in _READ_ONLY_TRAINER_CALLS],
        "retryPolicy": {
            "maxAttempts": 5,
            "initialBackoff": "0.1s",
            "maxBackoff": "1s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]
})


def channel_options(tls_server_name: Optional[str]) -> List[Tuple[str, Any]]:
    # Responses with attention maps or hidden states of long batches are large.
    options: List[Tuple[str, Any]] = [("grpc.max_receive_message_length", 256 << 20),
                                      ("grpc.max_send_message_length", 64 << 20),
                                      ("grpc.enable_retries", 1),
                                      ("grpc.service_config", RETRY_SERVICE_CONFIG)]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return options


def _bearer(secret: Optional[str]) -> List[Tuple[str, str]]:
    secret = (secret or "").strip()
    return [("authorization", f"Bearer {secret}")] if secret else []


class Connection:
    """Channel, stubs and credentials; the calls live in the mixins Client is made of."""

    def __init__(self, address: Optional[str] = None, token: Optional[str] = None,
                 tls: TlsOption = False, *, api_key: Optional[str] = None,
                 trainer_token: Optional[str] = None, model: str = "",
                 timeout: Optional[float] = 120.0,
                 tls_server_name: Optional[str] = None) -> None:
        if token is not None and api_key is not None:
            raise TypeError("give api_key (token is its old name), not both")
        self.address = address or os.environ.get("ATTNSERVE_ADDR") or DEFAULT_ADDRESS
        if api_key is None:
            api_key = token if token is not None else os.environ.get("ATTNSERVE_API_KEY")
        if trainer_token is None:
            trainer_token = token if token is not None else os.environ.get("ATTNSERVE_TOKEN")
        credentials = channel_credentials(tls)
        options = channel_options(tls_server_name)
        if credentials is None:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            self._channel = grpc.secure_channel(self.address, credentials, options=options)
        self._encoder = encoder_pb2_grpc.EncoderStub(self._channel)
        self._trainer = trainer_pb2_grpc.TrainerStub(self._channel)
        self._metadata = _bearer(api_key)
        self._trainer_metadata = _bearer(trainer_token)
        self.model = model
        self.timeout = timeout
        self._max_inputs: Optional[int] = None

    def close(self) -> None:
        """Closes the channel; calls after this fail."""
        self._channel.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        model = f", model={self.model!r}" if self.model else ""
        return f"{type(self).__name__}({self.address!r}{model})"

    # --- plumbing ------------------------------------------------------------------------------
    def _model(self, model: Optional[str]) -> str:
        return self.model if model is None else model

    def _error(self, error: grpc.RpcError, trainer: bool) -> AttnserveError:
        code = error.code() if hasattr(error, "code") else None
        hints = _TRAINER_HINTS if trainer else _ENCODER_HINTS
        hint = hints.get(code, "")
        details = error.details() if hasattr(error, "details") else ""
        if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (details or ""):
            hint = f"is attnserve serving gRPC at {self.address}?"
        return AttnserveError.from_rpc_error(error, hint)

    def _call(self, method: Callable[..., Any], request: Any, trainer: bool = False) -> Any:
        try:
            return method(request, timeout=self.timeout,
                          metadata=self._trainer_metadata if trainer else self._metadata)
        except grpc.RpcError as e:
            raise self._error(e, trainer) from None
