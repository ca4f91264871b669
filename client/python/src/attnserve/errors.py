"""The exceptions the client raises for a failed call: AttnserveError and one subclass per code.

    try:
        client.encode(["fine", ""])
    except attnserve.InvalidArgument as e:      # or any failure: except attnserve.AttnserveError
        print(e.code, e.message)

Each carries the gRPC status code (`code`) and the server's message unchanged (`message`); `hint`
is the client's own advice for a few codes (which token is missing, ...), shown after the message
in str(e) but never mixed into `message`.
"""
from __future__ import annotations

from typing import Dict, Optional, Type

import grpc


class AttnserveError(Exception):
    """A call the server (or the transport) refused or failed.

    `code` is the gRPC status code (grpc.StatusCode.INVALID_ARGUMENT, UNAUTHENTICATED, ...), and
    `message` the server's explanation, meant for a person. Catch a subclass (InvalidArgument,
    NotFound, ...) for one kind of failure.
    """

    def __init__(self, code: grpc.StatusCode, message: str, hint: str = "") -> None:
        text = f"{code.name}: {message}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)
        self.code = code
        self.message = message
        self.hint = hint

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError, hint: str = "") -> "AttnserveError":
        """The subclass for the error's code, with the server's message."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        code = code or grpc.StatusCode.UNKNOWN
        return error_class(code)(code, details or "", hint)


class InvalidArgument(AttnserveError, ValueError):
    """The request is malformed or over a limit; the message names the input and the limit."""


class NotFound(AttnserveError, LookupError):
    """An unknown model, version or job; the message names what the server has."""


class FailedPrecondition(AttnserveError):
    """The request is valid but the server's state does not allow it (no head, no store, ...)."""


class ResourceExhausted(AttnserveError):
    """Over a budget or the queue is full: retry later, or send less (the message says which)."""


class Unauthenticated(AttnserveError):
    """No key or token was sent for a service that needs one."""


class PermissionDenied(AttnserveError):
    """The key or token sent is not the server's."""


class Unavailable(AttnserveError):
    """The server cannot be reached, is loading its model, or is shutting down."""


class DeadlineExceeded(AttnserveError):
    """The call's timeout passed before the server answered."""


class Cancelled(AttnserveError):
    """The call was cancelled."""


class Unimplemented(AttnserveError):
    """The server does not offer this call (e.g. no Trainer service without a trainer token)."""


class InternalError(AttnserveError):
    """A fault inside the server; it keeps serving other calls."""


_CLASSES: Dict[grpc.StatusCode, Type[AttnserveError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: InternalError,
}


MAX_QUOTED_BYTES = 64


def quote(value: object) -> str:
    """User input in a message, as the server quotes it: in single quotes when at most 64 bytes
    of UTF-8, else its first 64 bytes (cut back to a character boundary) and "…(N bytes)";
    control characters as \\xNN."""
    text = value if isinstance(value, str) else repr(value)
    data = text.encode("utf-8", errors="surrogatepass")
    shown = data
    if len(data) > MAX_QUOTED_BYTES:
        end = MAX_QUOTED_BYTES
        while end > 0 and (data[end] & 0xC0) == 0x80:
            end -= 1
        shown = data[:end]
    body = "".join(f"\\x{ord(c):02X}" if ord(c) < 0x20 or ord(c) == 0x7F else c
                   for c in shown.decode("utf-8", errors="replace"))
    suffix = f"\u2026({len(data)} bytes)" if len(shown) < len(data) else ""
    return f"'{body}'{suffix}"


def error_class(code: grpc.StatusCode) -> Type[AttnserveError]:
    """The exception class the client raises for `code` (AttnserveError for the rest)."""
    return _CLASSES.get(code, AttnserveError)


def error(code: grpc.StatusCode, message: str, hint: Optional[str] = None) -> AttnserveError:
    """An exception of the class for `code`, for failures the client detects itself."""
    return error_class(code)(code, message, hint or "")
