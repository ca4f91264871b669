"""Python client for attnserve.

    import attnserve
    client = attnserve.Client("localhost:50051")
    vectors = client.encode(["The king spoke.", "The queen listened."])  # numpy (2, 384)

Every Encoder and Trainer call is a Client method (attnserve.aio.AsyncClient: the same as
coroutines). Every failed call raises attnserve.AttnserveError (a subclass per code:
InvalidArgument, NotFound, ...) carrying the gRPC code and the server's message.
"""
from attnserve._convert import (Attention, EncodedInput, Encoding, LabelScore, Ranking,
                                RerankHit, SparseVector, Timing, Token, TokenIds, TokenStates)
from attnserve._encoder_calls import TruncationWarning
from attnserve._evaluation import Evaluation, TrainingReport
from attnserve._explain import Attributions, Explanation, Word
from attnserve._finetune import FineTuneResult
from attnserve._jobs import Dataset, Job, JobEvent, JobList, Progress
from attnserve._versions import (EmbeddingDrift, HeadChange, MatrixChange, ModelInfo, Neighbors,
                                 TokenNeighbor, VersionDiff, VersionInfo)
from attnserve import aio
from attnserve.client import Client
from attnserve.errors import (AttnserveError, Cancelled, DeadlineExceeded, FailedPrecondition,
                              InternalError, InvalidArgument, NotFound, PermissionDenied,
                              ResourceExhausted, Unauthenticated, Unavailable, Unimplemented)

__all__ = [
    "Attention",
    "AttnserveError",
    "Attributions",
    "Cancelled",
    "Client",
    "Dataset",
    "DeadlineExceeded",
    "EmbeddingDrift",
    "EncodedInput",
    "Encoding",
    "Evaluation",
    "Explanation",
    "FailedPrecondition",
    "FineTuneResult",
    "HeadChange",
    "InternalError",
    "InvalidArgument",
    "Job",
    "JobEvent",
    "JobList",
    "LabelScore",
    "MatrixChange",
    "ModelInfo",
    "Neighbors",
    "NotFound",
    "PermissionDenied",
    "Progress",
    "Ranking",
    "RerankHit",
    "ResourceExhausted",
    "SparseVector",
    "Timing",
    "Token",
    "TokenIds",
    "TokenNeighbor",
    "TokenStates",
    "TrainingReport",
    "TruncationWarning",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "VersionDiff",
    "VersionInfo",
    "Word",
    "aio",
]
__version__ = "0.2.0"
