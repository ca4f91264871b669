"""attnserve.aio.AsyncClient: every Client call as a coroutine, for asyncio code.

Each call runs the blocking Client call on a thread of its own pool (gRPC releases the GIL while
it waits), so many calls can be in flight at once and the event loop never blocks:

    async with attnserve.aio.AsyncClient("localhost:50051") as client:
        a, b = await asyncio.gather(client.encode(["one"]), client.encode(["two"]))
        async for event in client.job_events(job.job_id):
            ...

The methods, their arguments and results are Client's (the coroutines are made from Client's
public methods, so the two cannot drift apart); job_events is an async iterator.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from typing import Any, AsyncIterator, Callable, Optional

from attnserve._jobs import JobEvent
from attnserve.client import Client


class AsyncClient:
    """Client(address, token, tls, ...) with awaitable calls; the arguments are Client's."""

    def __init__(self, *args: Any, max_concurrent_calls: int = 32, **kwargs: Any) -> None:
        self.client = Client(*args, **kwargs)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrent_calls,
                                                           thread_name_prefix="attnserve")

    async def _run(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))

    async def job_events(self, job_id: str, **kwargs: Any) -> AsyncIterator[JobEvent]:
        """Client.job_events as an async iterator: each event as it happens."""
        events = self.client.job_events(job_id, **kwargs)
        done = object()
        try:
            while True:
                event = await self._run(next, events, done)
                if event is done:
                    return
                yield event
        finally:
            await self._run(events.close)

    def close(self, wait: Optional[bool] = True) -> None:
        self._pool.shutdown(wait=bool(wait))
        self.client.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _coroutine(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def call(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
        return await self._run(getattr(self.client, name), *args, **kwargs)

    return call


for _name, _method in inspect.getmembers(Client, inspect.isfunction):
    if not _name.startswith("_") and _name not in vars(AsyncClient):
        setattr(AsyncClient, _name, _coroutine(_name, _method))
del _name, _method
