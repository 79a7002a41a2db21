"""The state store's memory on /metrics, against real Valkey servers of the tests' own: the
figures are the server's (INFO), evictions raise the counter, and a store that stops answering
leaves them unknown (one warning) while the sidecar's loops go on; back, they are read again."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
import valkey.asyncio as avalkey
from prometheus_client import generate_latest

from sidecar.app.service import Sidecar
from sidecar.app.state_store import StateMemoryPoller, register_state_memory_metrics
from sidecar.app.wiring import ValkeyClient
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalValkey
from sidecar.telemetry.metrics import SidecarMetrics
from tests.conftest import free_port
from tests.faults.support import wait_until
from tests.shadow_support import sidecar_settings
from tests.test_metrics import get
from tests.test_state_store import MiB, state_client, state_url

STATE = "ragflow_sidecar_state_store_"
POLLER_LOG = "sidecar.app.state_store"


def state_series(text: str) -> dict[str, float]:
    """The state store's samples in a scrape, by name with its labels; the others left out."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(rf"^({STATE}\w+)(?:\{{(.*)\}})? (\S+)$", line)
        if match is not None:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            policy = labels.get("policy")
            name = match.group(1) + (f"{{policy={policy}}}" if policy else "")
            found[name] = float(match.group(3))
    return found


def scrape(metrics: SidecarMetrics) -> dict[str, float]:
    return state_series(generate_latest(metrics.registry).decode())


async def evict(client: avalkey.Valkey, room: int) -> int:
    """``maxmemory`` at used_memory + ``room`` with allkeys-lru, then twice that much written:
    keys are evicted. Returns the limit."""
    await client.config_set("maxmemory-policy", "allkeys-lru")
    limit = int((await client.info("memory"))["used_memory"]) + room
    await client.config_set("maxmemory", limit)
    for start in range(0, 2 * room // 4096, 256):
        pipe = client.pipeline(transaction=False)
        for n in range(start, start + 256):
            pipe.set(f"filler:{n}", b"x" * 4096)
        await pipe.execute()
    return limit


async def test_the_gauges_report_the_servers_figures_and_its_evictions(
    state_valkey: LocalValkey,
) -> None:
    url = state_url(state_valkey)
    settings = Settings.from_env({"REDIS_URL": url})
    metrics = SidecarMetrics()
    own = ValkeyClient(settings.state)
    poller = StateMemoryPoller(own.client, settings.state.display_url, interval_s=0.05)
    register_state_memory_metrics(metrics, poller)
    client = state_client(state_valkey)
    try:
        # Unknown before the first read: absent, not 0 (0, then the server's count, would
        # read as that many evictions to increase()).
        assert scrape(metrics) == {}
        async with own, poller:

            async def read() -> bool:
                return STATE + "evicted_keys_total" in scrape(metrics)

            await wait_until(read, "the first read on /metrics", timeout_s=10)
            seen = scrape(metrics)
            assert seen[STATE + "used_memory_bytes"] > 0
            assert {k: v for k, v in seen.items() if "used" not in k} == {
                STATE + "maxmemory_bytes": 0,  # a fresh server: no limit, nothing evicted
                STATE + "evicted_keys_total": 0,
                STATE + "can_evict{policy=noeviction}": 0,
            }

            limit = await evict(client, MiB)
            server = await client.info("memory")
            evicted = int((await client.info("stats"))["evicted_keys"])
            assert evicted > 0

            async def caught_up() -> bool:
                return scrape(metrics).get(STATE + "evicted_keys_total") == evicted

            await wait_until(caught_up, "the evictions on /metrics", timeout_s=10)
            seen = scrape(metrics)
            # used_memory moves by a few KiB between two INFO calls (client buffers).
            used = seen.pop(STATE + "used_memory_bytes")
            assert abs(used - int(server["used_memory"])) < 64 * 1024
            assert limit / 2 < used <= limit + 64 * 1024
            assert seen == {
                STATE + "maxmemory_bytes": limit,
                STATE + "evicted_keys_total": evicted,
                STATE + "can_evict{policy=allkeys-lru}": 1,
            }

            # noeviction: one series, the policy's, at 0 (the old one gone, not left at 1).
            await client.config_set("maxmemory-policy", "noeviction")

            async def policy_seen() -> bool:
                return STATE + "can_evict{policy=noeviction}" in scrape(metrics)

            await wait_until(policy_seen, "the new policy on /metrics", timeout_s=10)
            seen = scrape(metrics)
            assert {k: v for k, v in seen.items() if "can_evict" in k} == {
                STATE + "can_evict{policy=noeviction}": 0
            }
        assert not poller.polling and poller.memory is None
    finally:
        await client.aclose()


async def test_a_store_that_stops_answering_leaves_its_figures_unknown_and_the_sidecar_running(
    settings: Settings,
    unique: str,
    state_valkey: LocalValkey,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The state store's server stops under a running sidecar (the sweeper alone, which rides
    an outage out): its series go, one warning says so, the loops and /metrics go on; the
    restarted server is read again, its evicted keys back at 0 (a counter reset)."""
    caplog.set_level(logging.INFO)
    port = free_port()
    config = sidecar_settings(
        settings,
        [f"{unique}.0"],
        unique,
        SIDECAR_STATE_URL=state_url(state_valkey),
        SIDECAR_STATE_POLL_S="0.1",
        SIDECAR_METRICS_PORT=str(port),
        SIDECAR_METRICS_HOST="127.0.0.1",
    )
    assert config.metrics.state_poll_s == 0.1
    client = state_client(state_valkey)
    try:
        await evict(client, MiB)
    finally:
        await client.aclose()

    async def scraped() -> dict[str, float]:
        status, text = await get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        return state_series(text)

    async def evictions_seen() -> bool:
        return (await scraped()).get(STATE + "evicted_keys_total", 0) > 0

    async def unknown() -> bool:
        return await scraped() == {}

    def sweeps_failed() -> int:
        return sum("verdict sweep failed" in r.getMessage() for r in caplog.records)

    stop = asyncio.Event()
    async with Sidecar(config, mirror=False, shadow=False, observer=False) as sidecar:
        loops = asyncio.create_task(sidecar.run(stop))
        try:
            await wait_until(evictions_seen, "the store's evictions on /metrics", timeout_s=10)
            state_valkey.stop()
            await wait_until(unknown, "the store's series to go", timeout_s=10)
            # The sweeper retries every second: three failed sweeps are dozens of failed polls.
            failed = sweeps_failed()

            async def outage_lasted() -> bool:
                return sweeps_failed() >= failed + 3

            await wait_until(outage_lasted, "three more failed sweeps", timeout_s=30)
            assert not loops.done() and sidecar.state_memory.polling
            assert sidecar.health.running["sweeper"]
            status, text = await get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200 and 'ragflow_sidecar_up{component="sweeper"' in text
            assert await unknown()

            state_valkey.start()  # the same port, an empty server: evicted_keys 0 again

            async def read_again() -> bool:
                return STATE + "evicted_keys_total" in await scraped()

            await wait_until(read_again, "the store's series back", timeout_s=30)
            back = await scraped()
            assert back[STATE + "evicted_keys_total"] == 0
            assert back[STATE + "maxmemory_bytes"] == 0  # the new server's: no limit
            assert back[STATE + "can_evict{policy=noeviction}"] == 0
            assert not loops.done()
        finally:
            stop.set()
            await asyncio.wait_for(loops, timeout=60)
    said = [r for r in caplog.records if r.name == POLLER_LOG]
    warnings = [r.getMessage() for r in said if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "state store's memory unknown until it answers INFO" in warnings[0]
    assert state_url(state_valkey).split("//")[1] in warnings[0]
    assert [r.getMessage() for r in said if r.levelno == logging.INFO] == [
        "state store's memory read again"
    ]
