"""Bounds on how many async reward calls run at once: `bounded`, `score_all`, `LoopBound`.

A workflow scores many completions concurrently; a reward that runs programs or calls a judge
must not start them all at the same moment. Two ways to bound it:

    @bounded(4)                                  # at most 4 calls of judge() at a time
    async def judge(text: str) -> float: ...
    ctx.reward(c, await judge(c.text))

    scores = await score_all(judge, texts, limit=4)   # one batch, results in order

`LoopBound` is the shared piece: an asyncio.Semaphore per running event loop, since a plain
module-level Semaphore binds to the first loop that waits on it and then fails in any other
(each test, each `asyncio.run`).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def _check_limit(limit: object, name: str) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{name} must be an int >= 1 (calls running at once), got {limit!r}")
    return limit


class LoopBound:
    """At most `limit` holders at once within each event loop."""

    def __init__(self, limit: int, *, name: str = "limit") -> None:
        self._name = name
        self._limit = _check_limit(limit, name)
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                   asyncio.Semaphore] = weakref.WeakKeyDictionary()

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        """New holders wait under the new limit; those already holding finish under the old."""
        self._limit = _check_limit(limit, self._name)
        self._per_loop = weakref.WeakKeyDictionary()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        semaphore = self._per_loop.get(loop)
        if semaphore is None:
            semaphore = self._per_loop[loop] = asyncio.Semaphore(self._limit)
        async with semaphore:
            yield


def bounded(limit: int) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Decorator: at most `limit` calls of the decorated async function run at once (per event
    loop); further calls wait their turn. Each decorated function has its own bound."""
    _check_limit(limit, "bounded(limit)")

    def wrap(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"bounded() wraps an async function (async def), got {fn!r}")
        gate = LoopBound(limit, name="bounded(limit)")

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> T:
            async with gate.hold():
                return await fn(*args, **kwargs)

        return call

    return wrap


async def score_all(fn: Callable[[Any], T | Awaitable[T]], items: Iterable[Any], *,
                    limit: int) -> list[T]:
    """`fn(item)` for every item, at most `limit` at a time, results in the items' order.

    `fn` may be async or plain. The calls run in one asyncio.TaskGroup: if one raises, the rest
    are cancelled and the errors come out as an ExceptionGroup.
    """
    semaphore = asyncio.Semaphore(_check_limit(limit, "score_all(limit)"))

    async def one(item: Any) -> T:
        async with semaphore:
            value = fn(item)
            return await value if inspect.isawaitable(value) else value

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(item)) for item in items]
    return [task.result() for task in tasks]
