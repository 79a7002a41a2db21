"""The autopilot against the session's real Valkey: its record, its lease, the live share it
sets, and its controls; as a process, killed with -9 and started again."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import valkey

from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack, LocalValkey
from sidecar.errors import ConfigError
from sidecar.rollout.autopilot import Autopilot
from sidecar.rollout.machine import GateView, RolloutState
from sidecar.serve.share import read_status
from sidecar.wire.contract import Keys
from tests.ragflow_support import wait_until
from tests.rollout_support import start_autopilot


def _settings(stack: LocalStack, unique: str, **env: str) -> Settings:
    """The autopilot's settings in-process: turns as fast as the test makes them."""
    fast = {"ROLLOUT_INTERVAL_S": "0.1", "ROLLOUT_LEASE_S": "1"}
    return Settings.from_env({**_env(stack, unique), **fast, **env})


class Clock:
    """A clock the test moves, so that every turn finds the gate due."""

    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


def _gate(decision: str, kafka: int = 10, redis: int = 10):  # type: ignore[no-untyped-def]
    async def look(settings: Settings, state: RolloutState, now_ms: int) -> GateView:
        return GateView(decision, ("a reason",), kafka, redis)  # type: ignore[arg-type]

    return look


async def test_a_clean_ramp_reaches_the_last_step_sets_the_live_share_and_watches(
    stack: LocalStack, unique: str
) -> None:
    settings = _settings(stack, unique)
    pilot = Autopilot(settings, gate=_gate("promote"), clock=Clock())
    try:
        shares = []
        for _ in range(5):
            await pilot.turn()
            shares.append((await read_status(settings)).values.live)
        state = await pilot.store.load()
        decisions = await pilot.store.decisions(10)
    finally:
        await pilot.stop()
    assert shares == [10.0, 50.0, 100.0, 100.0, 100.0]
    assert state is not None and (state.phase, state.share) == ("watching", 100.0)
    assert [d.action for d in decisions] == ["start", "promote", "promote", "promote", "hold"]
    assert "watching at 100 %" in decisions[-1].reason
    log = (await read_status(settings)).log
    assert {entry.by for entry in log} == {f"rollout {pilot.owner}"}


async def test_a_roll_back_sets_the_share_to_zero_by_itself_and_stays(
    stack: LocalStack, unique: str
) -> None:
    settings = _settings(stack, unique)
    says = ["promote"]

    async def gate(settings: Settings, state: RolloutState, now_ms: int) -> GateView:
        return GateView(says[0], ("kafka fails more",), 10, 10)  # type: ignore[arg-type]

    pilot = Autopilot(settings, gate=gate, clock=Clock())
    try:
        await pilot.turn()
        await pilot.turn()  # 10 -> 50
        says[0] = "rollback"
        decision = await pilot.turn()
        assert decision is not None and decision.action == "rollback"
        assert "kafka fails more" in decision.reason
        assert (await read_status(settings)).values.live == 0.0
        says[0] = "promote"
        decision = await pilot.turn()
        assert decision is not None and decision.action == "hold" and "resume" in decision.reason
        assert (await read_status(settings)).values.live == 0.0
        counts = await pilot.store.counts()
    finally:
        await pilot.stop()
    assert counts == {"start": 1, "promote": 1, "rollback": 1, "hold": 1}


async def test_one_autopilot_acts_and_another_takes_over_the_same_step_when_it_dies(
    stack: LocalStack, unique: str
) -> None:
    settings = _settings(stack, unique)
    first = Autopilot(settings, gate=_gate("promote"), clock=Clock())
    second = Autopilot(settings, gate=_gate("hold"), clock=Clock())
    try:
        await first.turn()
        await first.turn()  # at 50 %
        assert await second.turn() is None and not second.acting
        # The first dies without letting go (kill -9): its lease lapses after ROLLOUT_LEASE_S.
        await first._client.aclose()

        async def taken_over() -> bool:
            return await second.turn() is not None

        await wait_until(taken_over, 10, interval_s=0.2, what="the lease taken over")
        state = await second.store.load()
        assert state is not None and (state.step, state.share) == (1, 50.0)
        assert (await read_status(settings)).values.live == 50.0
    finally:
        await second.stop()


async def test_pause_resume_and_abort_from_the_command_line(
    stack: LocalStack, unique: str, tmp_path: Path
) -> None:
    settings = _settings(stack, unique)
    pilot = Autopilot(settings, gate=_gate("promote"), clock=Clock())
    env = {**os.environ, **_env(stack, unique)}
    try:
        await pilot.turn()  # 10 %
        _cli(env, "pause")
        decision = await pilot.turn()
        assert decision is not None and decision.action == "hold"  # the gate's turn, paused
        assert (await pilot.store.load()).phase == "paused"  # type: ignore[union-attr]
        _cli(env, "resume")
        await pilot.turn()
        assert (await pilot.store.load()).phase == "ramping"  # type: ignore[union-attr]
        out = _cli(env, "abort")
        assert "the served share is 0 now" in out
        assert (await read_status(settings)).values.live == 0.0  # at once, before any turn
        await pilot.turn()
        state = await pilot.store.load()
        assert state is not None and (state.phase, state.share) == ("aborted", 0.0)
        status = json.loads(_cli(env, "status", "--json"))
        actions = [d["action"] for d in status["decisions"]]
        assert actions[:4] == ["start", "pause", "hold", "resume"] and "abort" in actions
    finally:
        await pilot.stop()


def test_a_plan_above_the_ceiling_is_refused_at_start(stack: LocalStack, unique: str) -> None:
    settings = _settings(stack, unique, KAFKA_SERVE_PERCENT="50")
    with pytest.raises(ConfigError, match="above the ceiling KAFKA_SERVE_PERCENT=50") as caught:
        Autopilot(settings)
    assert caught.value.variable == "ROLLOUT_STEPS"
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "rollout", "run"],
        env={**os.environ, **_env(stack, unique), "KAFKA_SERVE_PERCENT": "50"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "ragflow-sidecar: error: ROLLOUT_STEPS: 100 above the ceiling" in result.stderr


async def test_killed_with_9_and_started_again_it_resumes_the_same_step(
    stack: LocalStack, unique: str, tmp_path: Path
) -> None:
    """As a process, with the real gate (no evidence: it holds at the first step)."""
    env = {**os.environ, **_env(stack, unique), "ROLLOUT_INTERVAL_S": "0.5"}
    settings = _settings(stack, unique)
    first = start_autopilot(env, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    try:

        async def at_first_step() -> bool:
            return (await read_status(settings)).values.live == 10.0

        await wait_until(at_first_step, 60, interval_s=0.2, what="the first step")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = start_autopilot(env, tmp_path / "second.log")
        log = tmp_path / "second.log"
        await wait_until(lambda: " acts (phase ramping, share 10 %)" in log.read_text(), 60,
                         what="the second autopilot acting")  # fmt: skip
        state_text = _cli(env, "status")
        assert "rollout: ramping, served share 10 %, step 1" in state_text, state_text
        assert (await read_status(settings)).values.live == 10.0
        assert "start" not in log.read_text().split(" acts ")[1], "it started the plan again"
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)


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
        "ROLLOUT_HOLDBACK_PERCENT": "0",
    }


def _cli(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "rollout", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_abort_while_the_state_store_is_down_waits_for_it_and_lands(
    stack: LocalStack, unique: str, state_valkey: LocalValkey
) -> None:
    """RAGFlow serves 0 by itself while it cannot read the share; `rollout abort` given then
    says so, waits for the store, and writes 0 (and the order) the moment it answers. With
    --wait-s 0 it fails at once, naming the store."""
    env = {**os.environ, **_env(stack, unique), "SIDECAR_STATE_URL": state_valkey.url}
    state_valkey.stop()
    failed = subprocess.run(
        [sys.executable, "-m", "sidecar", "rollout", "abort", "--wait-s", "0"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert failed.returncode == 2 and "cannot reach Valkey" in failed.stderr, failed.stderr
    waiting = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "rollout", "abort", "--wait-s", "60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert waiting.stderr is not None
        with concurrent.futures.ThreadPoolExecutor(1) as reader:
            first = reader.submit(waiting.stderr.readline).result(timeout=60)
        assert "does not answer" in first, first
        assert waiting.poll() is None, "abort did not wait for the store"
        state_valkey.start()
        out, err = waiting.communicate(timeout=30)
        err = first + err
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0, err
    assert "RAGFlow's processes serve 0 %" in err and err.count("does not answer") == 1, err
    assert "the served share is 0 now" in out
    store = valkey.Valkey.from_url(state_valkey.url)
    try:
        assert store.get(Keys(unique).share) == b"0"
        assert store.lrange(f"{unique}:rollout:commands", 0, -1) == [b"abort"]
    finally:
        store.close()
