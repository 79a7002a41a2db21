"""One asyncio event loop per process, in a thread of its own, for aiokafka under RAGFlow.

RAGFlow calls its queue methods synchronously (``queue_product`` from request handlers,
``queue_consumer``/``ack`` from the executor's coroutines, which block on them as they block
on Redis). aiokafka is asynchronous and its clients belong to one loop; so each process owns
one loop in a daemon thread, and the synchronous calls hand coroutines to it and wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LoopClosedError(RuntimeError):
    """The process is shutting down: its loop takes no more work."""


class BackgroundLoop:
    """A loop thread started on first use; a child of ``fork()`` gets a new one.

    ``run()`` waits for a coroutine's result; ``spawn()`` starts a long-lived task the loop
    owns until ``close()``, which cancels what is left and joins the thread.
    """

    def __init__(self, name: str = "ragflow-mq") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise LoopClosedError("ragflow_mq is closed")
            if self._loop is None or self._pid != os.getpid():
                # After fork() the parent's thread does not exist here: start afresh.
                self._loop = asyncio.new_event_loop()
                self._tasks = set()
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._serve, args=(self._loop, ready), name=self._name, daemon=True
                )
                self._pid = os.getpid()
                self._thread.start()
                ready.wait()
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()

    def in_loop_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (``TimeoutError`` after
        ``timeout_s``, the coroutine then cancelled)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("BackgroundLoop.run() called from its own thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout_s} s") from None

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; the caller keeps the future and reads its outcome."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        """Run a plain callback on the loop thread, without waiting."""
        self.loop.call_soon_threadsafe(callback, *args)

    def spawn(self, factory: Callable[[], Awaitable[None]], name: str) -> None:
        """Start a task the loop keeps until ``close()``; its failure is logged, not lost."""

        async def start() -> None:
            task = asyncio.create_task(_logged(factory, name), name=name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self.run(start())

    def close(self, closers: list[Callable[[], Awaitable[None]]], timeout_s: float) -> None:
        """Run ``closers`` in order, cancel the tasks left, stop the loop and join the thread.

        Each closer gets the time that remains of ``timeout_s``; one that fails or overruns
        is logged and the next still runs, so the process can always exit.
        """
        with self._lock:
            if self._closed or self._loop is None or self._pid != os.getpid():
                self._closed = True
                return
            self._closed = True
            loop, thread = self._loop, self._thread

        async def shut_down() -> None:
            deadline = loop.time() + timeout_s
            for closer in closers:
                try:
                    await asyncio.wait_for(closer(), max(deadline - loop.time(), 0.1))
                except Exception:
                    logger.exception("closing ragflow_mq")
            tasks = [task for task in self._tasks if not task.done()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        future = asyncio.run_coroutine_threadsafe(shut_down(), loop)
        try:
            future.result(timeout_s + 5)
        except Exception:
            logger.exception("ragflow_mq did not close in time")
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(5)


async def _logged(factory: Callable[[], Awaitable[None]], name: str) -> None:
    try:
        await factory()
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("ragflow_mq task %s failed", name)
