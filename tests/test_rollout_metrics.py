"""The autopilot on /metrics: its record read from real Valkey by the sidecar's poller,
exported as Prometheus scrapes it, present at 0 from start-up, and kept through a failed read."""

from __future__ import annotations

import asyncio
import json
import time

import valkey.asyncio as avalkey
from prometheus_client import generate_latest

from sidecar.app.wiring import ValkeyClient
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.rollout.machine import ACTIONS, PHASES, GateView, RolloutState, decide
from sidecar.rollout.rollout_metrics import RolloutPoller, register_rollout_metrics
from sidecar.rollout.store import RolloutStore
from sidecar.telemetry.metrics import SidecarMetrics
from tests.conftest import free_port
from tests.test_metrics import sample

DWELL_S = 600


def rollout_settings(stack: LocalStack, prefix: str, redis_url: str | None = None) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": redis_url or stack.valkey.url,
            "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
            "MQ_BACKEND": "split",
            "KAFKA_TRAFFIC_PERCENT": "100",
            "KAFKA_SERVE_PERCENT": "100",
            "SERVE_KEY_PREFIX": prefix,
            "ROLLOUT_STEPS": "1,5,25,50,100",
            "ROLLOUT_DWELL_S": str(DWELL_S),
            "ROLLOUT_MIN_DOCUMENTS": "200",
        }
    )


def scrape(metrics: SidecarMetrics) -> str:
    return generate_latest(metrics.registry).decode()


async def poll_until(poller: RolloutPoller, done: object) -> None:
    for _ in range(200):
        if poller.values.last is not None and poller.values.last.action == done:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the poller never read a {done!r} decision: {poller.values}")


async def test_the_poller_exports_the_autopilots_record(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    settings = rollout_settings(stack, unique)
    plan = settings.rollout
    metrics = SidecarMetrics()
    own = ValkeyClient(settings.state)
    poller = RolloutPoller(settings, client=own.client, interval_s=0.05)
    register_rollout_metrics(metrics, poller, settings)

    # Before the autopilot's first decision: everything there, at 0.
    text = scrape(metrics)
    for name in (
        "share", "step", "last_decision_timestamp_seconds", "dwell_left_seconds",
        "step_documents_expected", "step_hours_expected",
    ):  # fmt: skip
        assert sample(text, f"ragflow_sidecar_rollout_{name}") == 0
    for phase in PHASES:
        assert sample(text, "ragflow_sidecar_rollout_phase", phase=phase) == 0
    for action in ACTIONS:
        assert sample(text, "ragflow_sidecar_rollout_decisions_total", action=action) == 0
    for path in ("kafka", "redis"):
        assert sample(text, "ragflow_sidecar_rollout_documents_needed", path=path) == 0
        assert sample(text, "ragflow_sidecar_rollout_step_documents", path=path) == 0

    # What an autopilot records: a start, a promotion to 5 %, then a hold 100 s into that step
    # with 150 Kafka and 900 Redis tasks finished in it.
    store = RolloutStore(valkey_client, unique, settings.state.display_url)
    now_ms = int(time.time() * 1000) - 100_000
    started_ms = now_ms - DWELL_S * 1000
    state, decision = decide(plan, RolloutState(), None, started_ms)
    await store.record(state, decision)
    promote = GateView("promote", kafka_documents=300, redis_documents=900)
    state, decision = decide(plan, state, promote, now_ms)
    await store.record(state, decision)
    assert (decision.action, state.share) == ("promote", 5.0)
    state, held = decide(plan, state, GateView("promote", (), 150, 900), now_ms + 100_000)
    await store.record(state, held)
    # The plan `rollout run` kept at its start: this step (5 %) about 270 Kafka documents.
    steps = [{"share": 5.0 * i, "kafka_documents": 70 + 200 * i} for i in range(len(plan.steps))]
    await store.save_plan(json.dumps({"documents_per_min": 10.0, "steps": steps}))
    assert held.action == "hold"
    async with own, poller:
        await poll_until(poller, "hold")
        text = scrape(metrics)
        # A roll-back: the share back to 0, the phase says so, and nothing is waited for.
        rollback = GateView("rollback", ("kafka fails more",), 180, 950)
        await store.record(*decide(plan, state, rollback, now_ms + 160_000))
        await poll_until(poller, "rollback")
        rolled_back = scrape(metrics)
    assert sample(text, "ragflow_sidecar_rollout_share") == 5
    assert sample(text, "ragflow_sidecar_rollout_step") == 2
    assert sample(text, "ragflow_sidecar_rollout_phase", phase="ramping") == 1
    for phase in set(PHASES) - {"ramping"}:
        assert sample(text, "ragflow_sidecar_rollout_phase", phase=phase) == 0
    decisions = "ragflow_sidecar_rollout_decisions_total"
    assert sample(text, decisions, action="start") == 1
    assert sample(text, decisions, action="promote") == 1
    assert sample(text, decisions, action="hold") == 1
    assert sample(text, decisions, action="rollback") == 0
    last = sample(text, "ragflow_sidecar_rollout_last_decision_timestamp_seconds")
    assert last == held.at_ms / 1000
    assert sample(text, "ragflow_sidecar_rollout_step_documents", path="kafka") == 150
    assert sample(text, "ragflow_sidecar_rollout_step_documents", path="redis") == 900
    # The machine's own rule: 50 more Kafka tasks, Redis has enough; about 500 s of dwell.
    assert sample(text, "ragflow_sidecar_rollout_documents_needed", path="kafka") == 50
    assert sample(text, "ragflow_sidecar_rollout_documents_needed", path="redis") == 0
    assert 490 < sample(text, "ragflow_sidecar_rollout_dwell_left_seconds") <= 500
    # 120 Kafka documents more at 5 % of 10 a minute: 240 minutes.
    assert sample(text, "ragflow_sidecar_rollout_step_documents_expected") == 270
    assert sample(text, "ragflow_sidecar_rollout_step_hours_expected") == 4.0

    text = rolled_back
    assert sample(text, "ragflow_sidecar_rollout_share") == 0
    assert sample(text, "ragflow_sidecar_rollout_phase", phase="rolled_back") == 1
    assert sample(text, "ragflow_sidecar_rollout_phase", phase="ramping") == 0
    assert sample(text, decisions, action="rollback") == 1
    assert sample(text, "ragflow_sidecar_rollout_dwell_left_seconds") == 0
    assert sample(text, "ragflow_sidecar_rollout_documents_needed", path="kafka") == 0
    assert sample(text, "ragflow_sidecar_rollout_step_hours_expected") == 0
    assert not poller.started
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))


async def test_a_failed_read_keeps_the_last_values(
    stack: LocalStack, unique: str, valkey_client: avalkey.Valkey
) -> None:
    settings = rollout_settings(stack, unique)
    store = RolloutStore(valkey_client, unique, settings.state.display_url)
    await store.record(*decide(settings.rollout, RolloutState(), None, 1_000))
    async with (
        ValkeyClient(settings.state) as own,
        RolloutPoller(settings, client=own.client) as poller,
    ):
        assert await poller.poll()
        read = poller.values
        assert read.state is not None and read.state.share == 1.0
        assert read.counts == {"start": 1}
    # The same poller pointed at nothing: the read fails, the values stay, stop still ends it.
    nowhere = rollout_settings(stack, unique, f"redis://127.0.0.1:{free_port()}/1")
    async with (
        ValkeyClient(nowhere.state) as own,
        RolloutPoller(nowhere, client=own.client, interval_s=0.05) as failing,
    ):
        failing.values = read
        assert not await failing.poll()
        assert failing.values is read
    # A record that does not parse is a failed read too, not a crash of the poll loop.
    await valkey_client.set(store.keys.state, b"{not json")
    async with (
        ValkeyClient(settings.state) as own,
        RolloutPoller(settings, client=own.client) as garbled,
    ):
        garbled.values = read
        assert not await garbled.poll()
        assert garbled.values is read
    await valkey_client.delete(*await valkey_client.keys(f"{unique}:*"))
