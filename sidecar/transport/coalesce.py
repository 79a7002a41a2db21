"""Concurrent calls made into one batched call, each caller getting back its own part.

The shadow consumer runs up to ``MAX_CONCURRENT_TASKS`` tasks at once, and the observer reports
deliveries one by one; each used to record its side in the join with round trips of its own
(record, load, finish). A :class:`Coalescer` lets whoever calls first lead: it waits one turn
of the event loop for the others, runs one call for all of them, and hands each its results.
Calls arriving while that batch is in flight queue up and form the next batch, so batches
grow with the load and a lone caller waits no longer than one loop turn.

No task of its own: the leading caller does the work; when it is done and others are queued,
the first of them leads the next batch. Each caller still waits for its own results, so the
guarantees built on "recorded before acknowledged" hold unchanged. A batch that fails fails
every caller in it, with the same error; a leader that is cancelled leaves the others' items
to the next leader.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_LEAD = object()  # a queued caller's future is set to this when it is to lead the next batch


class Coalescer(Generic[T, R]):
    """Runs ``call`` on the items of concurrent ``submit`` calls, at most ``max_items`` at once
    (a caller's items are never split); ``call`` returns one result per item, in order."""

    def __init__(self, call: Callable[[list[T]], Awaitable[list[R]]], max_items: int) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._call = call
        self._max_items = max_items
        self._queue: deque[tuple[Sequence[T], asyncio.Future[object]]] = deque()
        self._busy = False
        self.batches = 0  # calls made, for the stats and the tests
        self.items = 0

    async def submit(self, items: Sequence[T]) -> list[R]:
        """The results for ``items``, from a call shared with whoever else submits now."""
        if self._max_items == 1:
            return await self._run(list(items))
        if self._busy:
            future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            self._queue.append((items, future))
            try:
                outcome = await future
            except asyncio.CancelledError:
                # Leadership handed to a caller cancelled at that moment passes on.
                if future.done() and not future.cancelled() and future.result() is _LEAD:
                    self._hand_over()
                raise
            if outcome is not _LEAD:
                return outcome  # type: ignore[return-value]
        else:
            self._busy = True
        try:
            await asyncio.sleep(0)  # the others calling in this turn join the batch
            return await self._lead(items)
        finally:
            self._hand_over()

    async def _run(self, items: list[T]) -> list[R]:
        self.batches += 1
        self.items += len(items)
        return await self._call(items)

    async def _lead(self, own: Sequence[T]) -> list[R]:
        """One call for the leader's items and as many queued callers' as fit."""
        batch: list[tuple[Sequence[T], asyncio.Future[object]]] = []
        size = len(own)
        while self._queue and size + len(self._queue[0][0]) <= self._max_items:
            items, future = self._queue.popleft()
            if not future.done():  # a caller cancelled while it waited is left out
                batch.append((items, future))
                size += len(items)
        try:
            results = await self._run([*own, *(item for items, _ in batch for item in items)])
        except asyncio.CancelledError:
            # The leader's own caller is being cancelled, not the others: their items go back
            # to the head of the queue and the next leader runs them again (recording a side
            # twice is harmless: the join answers "exists" or "redelivery").
            self._queue.extendleft(reversed(batch))
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            raise
        start = len(own)
        for items, future in batch:
            if not future.done():
                future.set_result(results[start : start + len(items)])
            start += len(items)
        return results[: len(own)]

    def _hand_over(self) -> None:
        """Let the first caller still waiting lead the next batch, or mark the coalescer idle."""
        while self._queue:
            _, future = self._queue.popleft()
            if not future.done():
                future.set_result(_LEAD)  # it stays busy: that caller leads now
                return
        self._busy = False
