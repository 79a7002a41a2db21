"""Running a long-lived command until SIGTERM/SIGINT, and again after a passing failure.

A signal only sets an event. The component is then told to stop taking work, given a grace
period to finish what it holds, and stopped. When it dies of a retriable error (Valkey
restarting, Kafka away at start) it is stopped and built afresh after a backoff, as a process
supervisor would restart it, with a growing backoff rather than a restart storm: what was read
and not acknowledged is replayed, exactly as after a crash. Any other error ends the command,
as does a failure during the grace period of a requested stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from sidecar.errors import SidecarError

logger = logging.getLogger(__name__)

RESTART_BACKOFF_INITIAL_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
# A component that ran this long before failing is restarted after the shortest backoff again.
HEALTHY_RUN_S = 60.0


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def run(self, stop: asyncio.Event) -> None: ...


async def run_until_signal(
    make: Callable[[], Service],
    grace_s: float,
    name: str,
    *,
    restart_backoff_s: float = RESTART_BACKOFF_INITIAL_S,
    preflight: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Build, start and run ``make()`` until SIGTERM/SIGINT; rebuild it after retriable errors.

    The signal handlers are in place before starting, so a stop during a slow start (a group
    join waiting on a broker) is an orderly exit too. ``preflight`` runs before each rebuild:
    a check that tells a refused login (not retriable) from a server that is away.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    backoff_s = restart_backoff_s
    try:
        rebuilding = False
        while True:
            began = time.monotonic()
            try:
                if rebuilding and preflight is not None:
                    await preflight()
                rebuilding = True
                return await _run_once(make(), stop, grace_s, name)
            except SidecarError as exc:
                if not exc.retriable or stop.is_set():
                    raise
                if time.monotonic() - began >= HEALTHY_RUN_S:
                    backoff_s = restart_backoff_s
                logger.warning("%s stopped: %s; starting again in %.1f s", name, exc, backoff_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=backoff_s)
            if stop.is_set():
                return 0
            backoff_s = min(backoff_s * 2, RESTART_BACKOFF_MAX_S)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


async def _run_once(component: Service, stop: asyncio.Event, grace_s: float, name: str) -> int:
    failed = False
    try:
        starting = asyncio.create_task(component.start(), name=f"{name}-start")
        stopping = asyncio.create_task(stop.wait(), name=f"{name}-stop-signal")
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            logger.info("stop requested while starting")
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            return 0
        stopping.cancel()
        starting.result()  # a failed start raises here
        return await _run_started(component, stop, grace_s, name)
    except BaseException:
        failed = True
        raise
    finally:
        try:
            await component.stop()
        except SidecarError as exc:
            # After a failure the servers may still be away: the first error is the one told.
            # A stop that was asked for has done its work (nothing unacked is lost) even if
            # a flush towards a server that is away fails.
            if not failed and not stop.is_set():
                raise
            logger.warning("%s did not stop cleanly: %s", name, exc)


async def _run_started(component: Service, stop: asyncio.Event, grace_s: float, name: str) -> int:
    running = asyncio.create_task(component.run(stop), name=name)
    stopping = asyncio.create_task(stop.wait(), name=f"{name}-stop-signal")
    await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not running.done():
        logger.info("stop requested; finishing the work in hand (grace %.0f s)", grace_s)
        try:
            await asyncio.wait_for(running, timeout=grace_s)
        except TimeoutError:
            logger.warning("grace period over; unfinished work will be replayed on restart")
    else:
        running.result()  # a crashed loop raises here
        if not stop.is_set():
            # Every loop runs until told to stop: one that ended on its own is a fault, and
            # a supervisor must see a non-zero exit to restart the process.
            raise SidecarError(f"{name} ended without being asked to stop")
    return 0
