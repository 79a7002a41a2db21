"""The supervisor: retriable failures rebuild the component, others end the command, a signal
stops it within the grace period."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from sidecar.app.supervisor import run_until_signal
from sidecar.errors import AuthenticationError, ServiceUnavailableError, SidecarError


class Component:
    """Fails its first runs with the given errors, then runs until stopped (or ignores it)."""

    built = 0
    stopped = 0

    def __init__(self, failures: list[SidecarError], ignore_stop: bool = False) -> None:
        self.failures = failures
        self.ignore_stop = ignore_stop
        Component.built += 1

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        Component.stopped += 1

    async def run(self, stop: asyncio.Event) -> None:
        if self.failures:
            raise self.failures.pop(0)
        # The run that lasts: ask for the stop as an operator would.
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGTERM)
        if self.ignore_stop:
            await asyncio.sleep(3600)
        await stop.wait()


@pytest.fixture(autouse=True)
def _counts() -> None:
    Component.built = Component.stopped = 0


async def test_retriable_failures_rebuild_the_component_until_a_signal_stops_it() -> None:
    failures: list[SidecarError] = [ServiceUnavailableError("valkey away")] * 2
    code = await run_until_signal(
        lambda: Component(failures), grace_s=5, name="t", restart_backoff_s=0.01
    )
    assert code == 0
    assert (Component.built, Component.stopped) == (3, 3)  # every build was stopped


async def test_a_failure_that_retrying_cannot_fix_ends_the_command() -> None:
    failures: list[SidecarError] = [AuthenticationError("refused")]
    with pytest.raises(AuthenticationError):
        await run_until_signal(
            lambda: Component(failures), grace_s=5, name="t", restart_backoff_s=0.01
        )
    assert (Component.built, Component.stopped) == (1, 1)


async def test_work_that_ignores_the_stop_is_cut_at_the_grace_period() -> None:
    code = await run_until_signal(
        lambda: Component([], ignore_stop=True), grace_s=0.2, name="t", restart_backoff_s=0.01
    )
    assert code == 0
    assert Component.stopped == 1
