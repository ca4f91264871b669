"""attnserve.aio.AsyncClient: Client's calls as coroutines, for asyncio code.

Each call runs the blocking Client call on a thread of its own pool (gRPC releases the GIL while
it waits), so many calls can be in flight at once and the event loop never blocks:

    async with attnserve.aio.AsyncClient("localhost:50051") as client:
        a, b = await asyncio.gather(client.encode(["one"]), client.encode(["two"]))
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any, Callable, List, Optional, TypeVar

import numpy as np

from attnserve._convert import Attention, LabelScore, Ranking, Token, TokenStates
from attnserve.client import Client, VersionInfo
from attnserve.v1 import encoder_pb2 as pb

_Result = TypeVar("_Result")


class AsyncClient:
    """Client(address, token, tls, ...) with awaitable calls; the arguments are Client's."""

    def __init__(self, *args: Any, max_concurrent_calls: int = 32, **kwargs: Any) -> None:
        self.client = Client(*args, **kwargs)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrent_calls,
                                                           thread_name_prefix="attnserve")

    async def _run(self, call: Callable[..., _Result], *args: Any, **kwargs: Any) -> _Result:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))

    async def encode(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return await self._run(self.client.encode, *args, **kwargs)

    async def token_embeddings(self, *args: Any, **kwargs: Any) -> List[TokenStates]:
        return await self._run(self.client.token_embeddings, *args, **kwargs)

    async def hidden_states(self, *args: Any, **kwargs: Any) -> List[TokenStates]:
        return await self._run(self.client.hidden_states, *args, **kwargs)

    async def attention(self, *args: Any, **kwargs: Any) -> Attention:
        return await self._run(self.client.attention, *args, **kwargs)

    async def tokenize(self, *args: Any, **kwargs: Any) -> List[List[Token]]:
        return await self._run(self.client.tokenize, *args, **kwargs)

    async def classify(self, *args: Any, **kwargs: Any) -> List[List[LabelScore]]:
        return await self._run(self.client.classify, *args, **kwargs)

    async def rerank(self, *args: Any, **kwargs: Any) -> Ranking:
        return await self._run(self.client.rerank, *args, **kwargs)

    async def model_info(self, model_version: str = "") -> pb.ModelInfo:
        return await self._run(self.client.model_info, model_version)

    async def versions(self) -> List[VersionInfo]:
        return await self._run(self.client.versions)

    async def rollback(self, version: str = "") -> List[VersionInfo]:
        return await self._run(self.client.rollback, version)

    async def promote(self, version: str) -> List[VersionInfo]:
        return await self._run(self.client.promote, version)

    def close(self, wait: Optional[bool] = True) -> None:
        self._pool.shutdown(wait=bool(wait))
        self.client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
