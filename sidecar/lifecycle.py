"""The start/stop contract every long-lived object in the sidecar keeps."""

from __future__ import annotations

import asyncio
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
