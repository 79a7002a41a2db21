"""``ragflow-sidecar doctor`` against real Valkey servers of each test's own, and RAGFlow's queue
code shape (tests/ragflow_standin) as the executors whose pending entries it reads and moves.

Each test starts its own Valkey (free port) so that its eviction policy and persistence are the
test's to set; the doctor runs as the command line does, in a child process with a clean
environment, and its exit code and lines are what is asserted.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import valkey.asyncio as avalkey
from prometheus_client import generate_latest

from sidecar.config import Settings
from sidecar.dev.local_stack.valkey import LocalValkey
from sidecar.doctor.poller import DoctorPoller, register_doctor_metrics
from sidecar.doctor.requeue import REQUEUED_KEY
from sidecar.telemetry.metrics import SidecarMetrics
from tests import tiers
from tests.conftest import free_port
from tests.ragflow_support import (
    StandinProcess,
    executions,
    pending_count,
    progress,
    read_produced,
    standin_env,
    wait_until,
)

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
GROUP = "rag_flow_svr_task_broker"


@pytest.fixture
@tiers.starts_servers
def servers(tmp_path: Path) -> Iterator[Callable[..., LocalValkey]]:
    """Starts Valkey servers of the test's own (``aof`` on or off); stops them by pid after."""
    started: list[LocalValkey] = []

    def start(name: str, aof: bool) -> LocalValkey:
        server = LocalValkey(tmp_path / name, free_port(), aof=aof)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


async def _configure(url: str, **config: str) -> None:
    client = avalkey.Valkey.from_url(url)
    try:
        for name, value in config.items():
            await client.config_set(name.replace("_", "-"), value)
    finally:
        await client.aclose()


def _doctor(
    redis_url: str, *args: str, state_url: str = "", streams: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    env |= {"PYTHONPATH": str(REPO), "REDIS_URL": redis_url}
    if state_url:
        env["SIDECAR_STATE_URL"] = state_url
    if streams:
        env["MIRROR_STREAMS"] = streams
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def _lines(result: subprocess.CompletedProcess[str], check: str) -> list[str]:
    return [line for line in result.stdout.splitlines() if f" {check} " in line]


async def test_allkeys_lru_without_persistence_names_each_risk_and_exits_1(
    servers: Callable[..., LocalValkey],
) -> None:
    ragflow = servers("ragflow", aof=False)
    state = servers("state", aof=False)
    # RAGFlow's Helm chart: 128 MB, allkeys-lru, no AOF; the state store likewise misconfigured.
    for server in (ragflow, state):
        await _configure(server.url, maxmemory="128mb", maxmemory_policy="allkeys-lru", save="")
    result = await asyncio.to_thread(_doctor, ragflow.url, state_url=state.url)
    assert result.returncode == 1, result.stdout + result.stderr
    (eviction,) = _lines(result, "ragflow-valkey.eviction")
    assert eviction.startswith("RISK") and "allkeys-lru at maxmemory 128.0 MiB" in eviction
    assert "task streams" in eviction and "queued tasks vanish" in eviction
    (persistence,) = _lines(result, "ragflow-valkey.persistence")
    assert persistence.startswith("RISK") and "no persistence" in persistence
    assert "#8575" in persistence
    (state_eviction,) = _lines(result, "state-store.eviction")
    assert state_eviction.startswith("RISK") and "served tasks run twice" in state_eviction
    (state_persistence,) = _lines(result, "state-store.persistence")
    assert state_persistence.startswith("RISK") and "claims" in state_persistence


async def test_rdb_only_is_a_risk_and_volatile_lru_a_note_for_ragflows_valkey(
    servers: Callable[..., LocalValkey],
) -> None:
    ragflow = servers("ragflow", aof=False)
    await _configure(ragflow.url, maxmemory="128mb", maxmemory_policy="volatile-lru", save="60 1")
    state = servers("state", aof=True)
    await _configure(state.url, maxmemory_policy="noeviction")
    result = await asyncio.to_thread(_doctor, ragflow.url, state_url=state.url)
    assert result.returncode == 1, result.stdout + result.stderr
    (eviction,) = _lines(result, "ragflow-valkey.eviction")
    # Compose's volatile-lru never evicts the streams, which carry no TTL.
    assert eviction.startswith("NOTE") and "never evicted" in eviction
    (persistence,) = _lines(result, "ragflow-valkey.persistence")
    assert persistence.startswith("RISK") and "RDB snapshots only (save 60 1)" in persistence


async def test_noeviction_with_aof_exits_0(servers: Callable[..., LocalValkey]) -> None:
    ragflow = servers("ragflow", aof=True)
    await _configure(ragflow.url, maxmemory="128mb", maxmemory_policy="noeviction")
    result = await asyncio.to_thread(_doctor, ragflow.url)
    assert result.returncode == 0, result.stdout + result.stderr
    (eviction,) = _lines(result, "ragflow-valkey.eviction")
    assert eviction.startswith("OK") and "nothing is dropped" in eviction
    (persistence,) = _lines(result, "ragflow-valkey.persistence")
    assert persistence.startswith("OK") and "AOF on (appendfsync everysec)" in persistence
    assert not [line for line in result.stdout.splitlines() if line.startswith("RISK")]


async def test_an_unreachable_valkey_is_cannot_tell_exit_2() -> None:
    result = await asyncio.to_thread(_doctor, f"redis://127.0.0.1:{free_port()}/1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert _lines(result, "ragflow-valkey.reachable")[0].startswith("UNKNOWN")


def test_older_than_must_be_a_duration() -> None:
    result = _doctor("redis://127.0.0.1:1/1", "--older-than", "soon")
    assert result.returncode == 2
    assert "--older-than" in result.stderr and "'soon'" in result.stderr


@pytest.fixture
async def queue_client(servers: Callable[..., LocalValkey]) -> AsyncIterator[avalkey.Valkey]:
    server = servers("ragflow", aof=True)
    await _configure(server.url, maxmemory_policy="noeviction")
    client = avalkey.Valkey.from_url(server.url)
    client.url = server.url  # type: ignore[attr-defined]
    yield client
    await client.aclose()


async def test_orphans_of_a_gone_pod_are_reported_requeued_once_and_run_once(
    queue_client: avalkey.Valkey, unique: str, tmp_path: Path
) -> None:
    url: str = queue_client.url  # type: ignore[attr-defined]
    key = f"{unique}:results"
    env = standin_env({"REDIS_URL": url}, prefix=unique, results_key=key, extra={"STANDIN_HEARTBEAT_S": "1"})  # fmt: skip
    streams = [f"{unique}.te.1.common", f"{unique}.te.0.common"]
    doctor_streams = ",".join(streams)
    out = tmp_path / "api.jsonl"
    api = StandinProcess.api(env, tmp_path, out, docs=2, tasks_per_doc=5).start()
    assert await api.await_exit(120) == 0, api.log_text()
    produced = {line["task_id"] for line in read_produced(out)}
    assert len(produced) == 10

    # A pod of RAGFlow's executors takes five tasks (its five slots) and is killed: its
    # consumer name (task_executor_common_<pod>_0) will never come back.
    gone = "task_executor_common_ragflow-7d9f-abcde_0"
    first = StandinProcess.executor(env, tmp_path, gone, STANDIN_WORK_MS="600000").start()
    with first:

        async def five_in_hand() -> bool:
            return await pending_count(queue_client, streams, GROUP) == 5

        await wait_until(five_in_hand, 60, what="five tasks in hand")
        assert first.kill() == -9

    # Just killed: it heartbeat and read a moment ago, so it still looks alive: refused.
    early = await asyncio.to_thread(_doctor, url, "--requeue-orphans", "--older-than", "20s", streams=doctor_streams)  # fmt: skip
    assert "requeued 0 entries" in early.stdout, early.stdout + early.stderr
    (refused,) = _lines(early, "requeue.refused")
    assert gone in refused and "still looks alive" in refused
    assert await pending_count(queue_client, streams, GROUP) == 5

    # The replacement pod, under a new name, runs what nobody held.
    live = "task_executor_common_ragflow-7d9f-fghij_0"
    with StandinProcess.executor(env, tmp_path, live, STANDIN_WORK_MS="0") as second:

        async def others_done() -> bool:
            return len([r for r in await executions(queue_client, key) if r["consumer"] == live]) == 5  # fmt: skip

        await wait_until(others_done, 60, what="the five undelivered tasks run")
        await asyncio.sleep(3.5)  # the gone pod's last heartbeat and read now older than 3 s

        report = await asyncio.to_thread(_doctor, url, "--older-than", "3s", streams=doctor_streams)  # fmt: skip
        assert report.returncode == 1, report.stdout + report.stderr
        (orphan,) = _lines(report, "executors.orphans")
        assert orphan.startswith("RISK") and gone in orphan
        assert "5 pending entries, oldest delivered" in orphan
        age_s = int(orphan.split("oldest delivered ")[1].split(" s ago")[0])
        assert age_s >= 3
        assert any(live in line and line.startswith("OK") for line in _lines(report, "executors.consumer"))  # fmt: skip

        moved = await asyncio.to_thread(_doctor, url, "--requeue-orphans", "--older-than", "3s", streams=doctor_streams)  # fmt: skip
        assert "requeued 5 entries" in moved.stdout, moved.stdout + moved.stderr
        assert len([line for line in moved.stdout.splitlines() if line.startswith(f"requeued {streams[1]} ")]) == 5  # fmt: skip

        async def all_done() -> bool:
            done = {p["task_id"] for p in await progress(queue_client, key) if p["progress"] == 1.0}
            return done >= produced and await pending_count(queue_client, streams, GROUP) == 0

        await wait_until(all_done, 60, what="every task done and nothing pending")

        again = await asyncio.to_thread(_doctor, url, "--requeue-orphans", "--older-than", "3s", streams=doctor_streams)  # fmt: skip
        assert "requeued 0 entries" in again.stdout, again.stdout + again.stderr
        assert again.returncode == 0, again.stdout + again.stderr
        assert await asyncio.to_thread(second.terminate) == 0, second.log_text()

    # Each task ran once on the live executor: the five it found, the five moved to it.
    ran = [r["task_id"] for r in await executions(queue_client, key) if r["consumer"] == live]
    assert sorted(ran) == sorted(produced)
    records = await queue_client.xrange(REQUEUED_KEY)
    assert len(records) == 5
    assert {fields[b"consumer"].decode() for _, fields in records} == {gone}
    assert all(fields[b"to_id"] for _, fields in records)


async def test_the_lag_ragflow_shows_is_checked_against_the_backlog(
    servers: Callable[..., LocalValkey],
) -> None:
    server = servers("ragflow", aof=True)
    await _configure(server.url, maxmemory_policy="noeviction")
    client = avalkey.Valkey.from_url(server.url)
    try:
        for stream in ("te.1.common", "te.0.common"):
            await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
            ids = [await client.xadd(stream, {"message": f'{{"id": "{n}"}}'}) for n in range(4)]
        # te.0.common: one entry read, then one unread deleted: Valkey can no longer count the
        # lag (nil), and RAGFlow shows no queue position.
        await client.xreadgroup(GROUP, "task_executor_common_a_0", {"te.0.common": ">"}, count=1)
        await client.xdel("te.0.common", ids[2])
    finally:
        await client.aclose()
    result = await asyncio.to_thread(_doctor, server.url)
    lags = {line.split()[2].rstrip(":"): line for line in _lines(result, "ragflow-valkey.lag")}
    assert lags["te.1.common"].startswith("OK") and "lag 4 matches" in lags["te.1.common"]
    assert lags["te.0.common"].startswith("NOTE") and "lag is nil" in lags["te.0.common"]
    assert "2 entries are undelivered" in lags["te.0.common"]
    assert "1 delivered and not yet acked" in lags["te.0.common"]


def _series(metrics: SidecarMetrics) -> dict[str, float]:
    """The doctor's samples in a scrape, by name with its own labels (not OpenTelemetry's)."""
    found: dict[str, float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        match = re.match(r"^(ragflow_sidecar_(?:doctor|orphaned)_\w+)\{(.*)\} (\S+)$", line)
        if match:
            labels = re.findall(r'(\w+)="([^"]*)"', match.group(2))
            own = ",".join(f'{k}="{v}"' for k, v in labels if not k.startswith("otel_"))
            found[f"{match.group(1)}{{{own}}}"] = float(match.group(3))
    return found


async def test_the_findings_and_orphans_are_on_metrics(
    servers: Callable[..., LocalValkey],
) -> None:
    server = servers("ragflow", aof=False)
    await _configure(server.url, maxmemory="128mb", maxmemory_policy="allkeys-lru", save="")
    settings = Settings.from_env({"REDIS_URL": server.url})
    client = avalkey.Valkey.from_url(server.url)
    metrics = SidecarMetrics()
    poller = DoctorPoller(settings, client, None, interval_s=0.1, older_than_ms=500)
    register_doctor_metrics(metrics, poller)
    try:
        await client.xgroup_create("te.0.common", GROUP, id="0", mkstream=True)
        for n in range(3):
            await client.xadd("te.0.common", {"message": f'{{"id": "{n}"}}'})
        await client.xreadgroup(GROUP, "task_executor_common_gone_0", {"te.0.common": ">"}, count=3)
        assert _series(metrics) == {}  # unknown before the first reading: absent, not 0
        async with poller:
            orphans = 'ragflow_sidecar_orphaned_pending_entries{stream="te.0.common"}'

            async def seen() -> bool:
                return _series(metrics).get(orphans) == 3

            await wait_until(seen, 10, what="the orphans on /metrics")
            series = _series(metrics)
            assert series['ragflow_sidecar_orphaned_pending_oldest_seconds{stream="te.0.common"}'] >= 0.5  # fmt: skip
            risks = {k for k, v in series.items() if 'severity="risk"' in k and v}
            assert risks == {
                f'ragflow_sidecar_doctor_findings{{check="{check}",severity="risk"}}'
                for check in (
                    "ragflow-valkey.eviction",
                    "ragflow-valkey.persistence",
                    "executors.orphans",
                )
            }
            await client.xack("te.0.common", GROUP, *[i for i, _ in await client.xrange("te.0.common")])  # fmt: skip

            async def cleared() -> bool:
                return _series(metrics).get(orphans) == 0

            await wait_until(cleared, 10, what="no orphan on /metrics once acked")
    finally:
        await client.aclose()
        metrics.shutdown()
