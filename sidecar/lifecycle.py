"""The start/stop contract every long-lived object in the sidecar keeps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Lifecycle(ABC):
    """Idempotent ``start()``/``stop()`` and ``async with`` for every long-lived client."""

    def __init__(self) -> None:
        self._lifecycle_lock = asyncio.Lock()
        self._started = False

    async def start(self) -> None:
        """Connect; calling it again on a started object does nothing."""
        async with self._lifecycle_lock:
            if not self._started:
                await self._start()
                self._started = True

    async def stop(self) -> None:
        """Flush and disconnect; calling it again, or before ``start()``, does nothing."""
        async with self._lifecycle_lock:
            if self._started:
                self._started = False
                await self._stop()

    @property
    def started(self) -> bool:
        return self._started

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @abstractmethod
    async def _start(self) -> None: ...

    @abstractmethod
    async def _stop(self) -> None: ...


class Poller(Lifecycle):
    """Calls :meth:`poll` every ``interval_s`` on a task of its own, from ``start()`` to
    ``stop()``; a poll's failure is the poll's to handle (it returns ``False``)."""

    def __init__(self, interval_s: float, name: str) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self._halt = asyncio.Event()
        self._failing = False
        # The subclass's module names the log lines: they are about its data, not the loop.
        self._logger = logging.getLogger(type(self).__module__)

    async def _start(self) -> None:
        self._halt = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name=self._name)

    async def _stop(self) -> None:
        # The event ends the loop between polls; the cancel ends a poll waiting on I/O. Both,
        # because a cancel landing in valkey-py's connection check can be taken for a timeout.
        self._halt.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def polling(self) -> bool:
        """Whether the loop is alive (started, and not ended by anything)."""
        return self._task is not None and not self._task.done()

    async def _loop(self) -> None:
        while not self._halt.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._halt.wait(), timeout=self._interval_s)

    def failed(self, what: str, exc: BaseException) -> bool:
        """Log ``what`` happened on a failed read, once an outage rather than at every poll;
        ``False``, for ``poll`` to return."""
        if not self._failing:
            self._logger.warning("%s: %s", what, exc)
        self._failing = True
        return False

    def answered(self, what: str) -> None:
        """A read succeeded: log ``what`` if it ends an outage."""
        if self._failing:
            self._logger.info("%s", what)
        self._failing = False

    @abstractmethod
    async def poll(self) -> bool:
        """One read; ``False`` when it failed."""
