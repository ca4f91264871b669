"""Python client for attnserve.

    import attnserve
    client = attnserve.Client("localhost:50051")
    vectors = client.encode(["The king spoke.", "The queen listened."])  # numpy (2, 384)

Every failed call raises attnserve.AttnserveError carrying the gRPC code and the server's
message.
"""
from attnserve._convert import (Attention, LabelScore, Ranking, RerankHit, Token,
                                TokenStates)
from attnserve._evaluation import Evaluation, TrainingReport
from attnserve._finetune import FineTuneResult
from attnserve import aio
from attnserve.client import Client, VersionInfo
from attnserve.errors import AttnserveError

__all__ = [
    "Attention",
    "AttnserveError",
    "Client",
    "Evaluation",
    "FineTuneResult",
    "LabelScore",
    "Ranking",
    "RerankHit",
    "Token",
    "TokenStates",
    "TrainingReport",
    "VersionInfo",
]
__version__ = "0.1.0"
