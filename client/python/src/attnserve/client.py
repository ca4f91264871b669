"""attnserve.Client: the Encoder and Trainer services as numpy arrays and plain Python values."""
from __future__ import annotations

from attnserve._base import DEFAULT_ADDRESS, TlsOption, channel_credentials, channel_options
from attnserve._encoder_calls import EncoderCalls
from attnserve._trainer_calls import TrainerCalls
from attnserve._versions import VersionInfo, versions_of

# The names this module had before the calls moved to _encoder_calls / _trainer_calls.
__all__ = ["Client", "DEFAULT_ADDRESS", "TlsOption", "VersionInfo", "channel_credentials",
           "channel_options", "versions_of"]


class Client(EncoderCalls, TrainerCalls):
    """A connection to an attnserve server: every Encoder and Trainer call as a method.

    >>> client = attnserve.Client("localhost:50051")
    >>> client.encode(["a sentence", "another"]).shape
    (2, 384)

    address: "host:port" (default: $ATTNSERVE_ADDR, else localhost:50051).
    api_key: sent as `authorization: Bearer <key>` on Encoder calls, for a server started with
    --api-key-file (default: $ATTNSERVE_API_KEY). trainer_token: sent on Trainer calls
    (fine-tuning, versions, jobs; the server's --trainer-token-file; default:
    $ATTNSERVE_TOKEN). token: the old name of api_key, also the trainer token unless
    trainer_token is given.
    tls: False (plain TCP), True (the system's roots), a CA certificate (PEM bytes or a path), or
    grpc.ChannelCredentials; tls_server_name overrides the name the certificate must carry.
    model: the served model every call uses unless it names one (model="" = the server's
    default; see models()). timeout: seconds per call (streams excepted), None = no limit.

    Results are numpy arrays (float32) or small dataclasses. A failed call raises
    attnserve.AttnserveError, or its subclass for the code (InvalidArgument, NotFound,
    Unauthenticated, ...), with the gRPC `code` and the server's `message`.
    """
