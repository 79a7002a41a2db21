"""The autopilot's evidence is its rollout's own and outlives it (real Valkey): killed with -9
and started again it judges the same minutes, even once their own keys have lapsed, and a
rollout resumed after an abort judges nothing recorded before its exact start."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import valkey.asyncio as avalkey

from ragflow_mq.recorder import Recorder, write
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.rollout.autopilot import Autopilot
from sidecar.rollout.machine import Decision, RolloutState
from sidecar.rollout.store import RolloutKeys
from sidecar.serve.gate_source import SETTLED_MINUTES
from sidecar.transport.topics import init_topics
from sidecar.wire.contract import Keys
from tests.ragflow_support import wait_until
from tests.rollout_support import start_autopilot


def _env(stack: LocalStack, unique: str) -> dict[str, str]:
    return {
        "REDIS_URL": stack.valkey.url,
        "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
        "MQ_BACKEND": "split",
        "KAFKA_TRAFFIC_PERCENT": "100",
        "KAFKA_SERVE_PERCENT": "100",
        "SERVE_KEY_PREFIX": unique,
        "ROLLOUT_STEPS": "10,50,100",
        "ROLLOUT_DWELL_S": "0",
        "ROLLOUT_MIN_DOCUMENTS": "5",
        "ROLLOUT_LEASE_S": "2",
        "ROLLOUT_INTERVAL_S": "0.3",
    }


def _documents(
    recorder: Recorder, path: str, at_s: float, n: int, failed: int = 0, tag: str = ""
) -> None:
    """``n`` documents of one task each finished on ``path`` at ``at_s``, ``failed`` of them
    failed."""
    recorder.count(path, "started", n, at_s=at_s)
    recorder.count(path, "finished", n, at_s=at_s)
    recorder.count(path, "failed", failed, at_s=at_s)
    for i in range(n):
        document = f"{tag}{path}-{at_s:.0f}-{i}"
        recorder.first(path, "started", document, latency="queue_wait", ms=200.0, at_s=at_s)
        recorder.first(path, "finished", document, latency="processing", ms=2000.0, at_s=at_s)
        if i < failed:
            recorder.first(path, "failed", document, at_s=at_s)


async def _write(client: avalkey.Valkey, unique: str, recorder: Recorder) -> None:
    pipe = client.pipeline(transaction=False)
    write(pipe, Keys(unique), recorder.drain())
    await pipe.execute()


async def _decisions(client: avalkey.Valkey, unique: str) -> list[Decision]:
    entries = await client.xrange(RolloutKeys(unique).log)
    return [
        Decision.from_fields({k.decode(): v.decode() for k, v in fields.items()})
        for _, fields in entries
    ]


async def test_killed_with_9_and_started_again_mid_step_it_keeps_its_evidence_and_decision(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey, tmp_path: Path
) -> None:
    """A step two hours old whose Kafka path fails more: the first autopilot holds on that
    evidence; killed with -9, its minutes' own keys lapse (as after two days), and the second
    one decides the same from the rollout's ledger."""
    now_s = time.time()
    started_ms = int((now_s - 7200) * 1000)
    state = RolloutState("ramping", 0, 10.0, started_ms, started_ms, updated_ms=started_ms)
    await valkey_client.set(RolloutKeys(unique).state, state.to_json())
    recorder = Recorder()
    # Settled (SETTLED_MINUTES old, when no outcome is filed under them any more), after the
    # start.
    minutes = [now_s - 60 * back for back in range(SETTLED_MINUTES + 8, SETTLED_MINUTES + 4, -1)]
    for at_s in minutes:
        _documents(recorder, "kafka", at_s, 10, failed=1)
        _documents(recorder, "redis", at_s, 40)
    await _write(valkey_client, unique, recorder)
    env = {**os.environ, **_env(stack, unique)}
    await init_topics(Settings.from_env(_env(stack, unique)).kafka)  # the verdicts the gate reads
    first = start_autopilot(env, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    try:

        async def judged_once() -> bool:
            return any(d.evidence for d in await _decisions(valkey_client, unique))

        await wait_until(judged_once, 60, interval_s=0.2, what="the first autopilot's look")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        before = [d for d in await _decisions(valkey_client, unique) if d.evidence][-1]
        assert before.action == "hold" and "kafka fails more than redis" in before.reason
        assert before.evidence["kafka_documents"] == 40, before.evidence
        # The minutes' own keys gone, as EVIDENCE_TTL_S after they were written.
        lapsed = [Keys(unique).evidence(int(at_s // 60)) for at_s in minutes]
        assert await valkey_client.delete(*lapsed) == len(minutes)
        seen = len(await _decisions(valkey_client, unique))
        second = start_autopilot(env, tmp_path / "second.log")

        async def judged_again() -> bool:
            return len(await _decisions(valkey_client, unique)) > seen

        await wait_until(judged_again, 60, interval_s=0.2, what="the second autopilot's look")
        after = (await _decisions(valkey_client, unique))[seen]
        assert (after.action, after.reason, after.evidence) == (
            before.action,
            before.reason,
            before.evidence,
        )
        assert "start" not in (tmp_path / "second.log").read_text().split(" acts ")[1]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


async def test_a_rollout_resumed_after_an_abort_judges_none_of_the_aborted_ones_minutes(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    """Every Kafka document of the aborted rollout failed, some in the very minute the new
    one starts in; the new one's own documents are healthy: it sees only those."""
    minute_s = (time.time() // 60 - 3) * 60  # a minute boundary, three minutes ago
    clock = Clock(minute_s + 5)
    settings = Settings.from_env({**_env(stack, unique), "ROLLOUT_INTERVAL_S": "0.1"})
    await init_topics(settings.kafka)
    pilot = Autopilot(settings, clock=clock)
    recorder = Recorder()
    try:
        assert (await pilot.turn() or _never()).action == "start"
        _documents(recorder, "kafka", minute_s + 10, 30, failed=30, tag="aborted-")
        _documents(recorder, "redis", minute_s + 10, 30, tag="aborted-")
        await _write(valkey_client, unique, recorder)
        await pilot.store.order("abort")
        clock.now_s = minute_s + 20
        await pilot.turn()
        assert (await pilot.store.load() or _never_state()).phase == "aborted"
        await pilot.store.order("resume")
        clock.now_s = minute_s + 30
        await pilot.turn()
        resumed = await pilot.store.load() or _never_state()
        assert (resumed.phase, resumed.started_ms) == ("ramping", int(clock.now_s * 1000))
        _documents(recorder, "kafka", minute_s + 40, 7, tag="new-")
        _documents(recorder, "redis", minute_s + 40, 9, tag="new-")
        await _write(valkey_client, unique, recorder)
        clock.now_s = minute_s + 70
        looked = await pilot.turn() or _never()
    finally:
        await pilot.stop()
    assert looked.evidence["kafka_documents"] == 7 and looked.evidence["redis_documents"] == 9, (
        looked
    )
    assert "kafka fails more" not in looked.reason, looked.reason
    assert looked.action == "hold"


def _never() -> Decision:
    raise AssertionError("no decision")


def _never_state() -> RolloutState:
    raise AssertionError("no state")
