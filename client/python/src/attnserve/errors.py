"""The one exception the client raises for a failed call."""
from __future__ import annotations

import grpc


class AttnserveError(Exception):
    """A call the server (or the transport) refused or failed.

    `code` is the gRPC status code (grpc.StatusCode.INVALID_ARGUMENT, UNAUTHENTICATED, ...), and
    `message` the server's explanation, meant for a person.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "AttnserveError":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
