"""``ragflow-sidecar rollout plan`` through ``main()`` against the session's real Valkey: the
site's minutes written as ragflow_mq writes them (HINCRBY on the minute hashes) under a key
prefix of the test's own, read back and forecast; ``rollout status`` against a kept plan."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import numpy as np
import pytest
import valkey

from sidecar.cli.main import main
from sidecar.cli.rollout import _plan_at_start, render_status, step_lines
from sidecar.config import Settings
from sidecar.dev.local_stack import LocalStack
from sidecar.rollout.machine import Decision, RolloutState
from sidecar.wire.contract import BUCKETS_MS, Keys, bucket_field, count_field

HOURS = 3


def _write_site(url: str, prefix: str, documents_per_min: int) -> None:
    """The last ``HOURS`` hours of a site on Redis alone: documents a minute, 4 % failing,
    lognormal processing times (median 20 s)."""
    keys, rng = Keys(prefix), np.random.default_rng(5)
    client = valkey.Valkey.from_url(url)
    now_min = int(time.time() // 60)
    pipe = client.pipeline(transaction=False)
    for minute in range(now_min - HOURS * 60, now_min + 1):
        key = keys.evidence(minute)
        pipe.hincrby(key, count_field("redis", "document_finished"), documents_per_min)
        pipe.hincrby(key, count_field("redis", "document_failed"), int(rng.binomial(5, 0.04)))
        for ms in rng.lognormal(np.log(20_000), 1.1, documents_per_min):
            index = int(np.searchsorted(BUCKETS_MS, ms))
            pipe.hincrby(key, bucket_field("redis", "document_processing", index), 1)
        pipe.expire(key, 3600 * (HOURS + 1))
    pipe.execute()
    client.close()


def _run(
    stack: LocalStack,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
) -> tuple[int, str, str]:
    env = {
        "REDIS_URL": stack.valkey.url,
        "SERVE_KEY_PREFIX": unique,
        # Unreachable: the plan reads the state store only.
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = main(["rollout", "plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_forecasts_the_site_from_its_own_minutes(
    stack: LocalStack,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _write_site(stack.valkey.url, unique, 5)
    # The default window (two days) holds only these hours: the minutes before them are not
    # counted as minutes without documents.
    code, out, err = _run(stack, unique, monkeypatch, capsys, "--json")
    assert code == 0, err
    planned = json.loads(out)
    assert planned["documents_per_min"] == pytest.approx(5.0, rel=0.05)
    assert 0.01 < planned["failure_rate"] < 0.1
    assert 0.8 < planned["processing_variance"] < 2.0  # sigma 1.1 on ln ms, bucketed
    assert [s["share"] for s in planned["steps"]] == [5.0, 25.0, 50.0, 95.0]
    assert 0 < planned["hours_p50"] < planned["hours_p95"]
    assert planned["steps"][2]["kafka_documents"] > planned["steps"][0]["kafka_documents"]

    code, out, err = _run(stack, unique, monkeypatch, capsys, "--since", f"{HOURS}h")
    assert code == 0, err
    assert f"expected to reach 100 %: about {planned['hours_p50']:g} h (p50)" in out
    assert "about" in out and "95%" in out

    code, out, err = _run(
        stack, unique, monkeypatch, capsys, "--since", f"{HOURS}h", "--within", "24h", "--json"
    )
    assert code == 0, err
    assert set(json.loads(out)["within_margins"]) == {"failed", "processing", "queue_wait"}


def test_run_prints_the_plan_at_its_start_and_keeps_it_for_status(
    stack: LocalStack, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_site(stack.valkey.url, unique, 5)
    settings = Settings.from_env({"REDIS_URL": stack.valkey.url, "SERVE_KEY_PREFIX": unique})
    asyncio.run(_plan_at_start(settings))
    assert "expected to reach 100 %" in capsys.readouterr().out
    client = valkey.Valkey.from_url(stack.valkey.url)
    kept = json.loads(client.get(f"{unique}:rollout:plan"))  # type: ignore[arg-type]
    client.close()
    assert [s["share"] for s in kept["steps"]] == [5.0, 25.0, 50.0, 95.0]
    assert kept["steps"][2]["kafka_documents"] > 0


def test_plan_without_evidence_says_what_is_missing(
    stack: LocalStack,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = _run(stack, unique, monkeypatch, capsys, "--since", "1h")
    assert code != 0
    assert "no finished documents in the last 1 h" in err and unique in err


@pytest.mark.parametrize("bad", ["7x", "-1d", "0h", "soon"])
def test_plan_refuses_a_duration_it_cannot_read(
    stack: LocalStack,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bad: str,
) -> None:
    with pytest.raises(SystemExit) as exited:
        _run(stack, unique, monkeypatch, capsys, f"--within={bad}")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--within" in err and "is not a duration" in err


def test_status_shows_each_step_against_the_plan() -> None:
    planned = {
        "documents_per_min": 5.0,
        "steps": [
            {"share": 5.0, "kafka_documents": 60},
            {"share": 25.0, "kafka_documents": 250},
            {"share": 50.0, "kafka_documents": 1500},
            {"share": 95.0, "kafka_documents": 40},
        ],
    }
    now_ms = 1_000 * 60_000
    state = RolloutState(phase="ramping", step=1, share=25.0, step_since_ms=1, started_ms=1)
    look = Decision(1, "hold", "ramping", 25.0, 25.0, "margins", {"kafka_documents": 100})
    text = render_status(state, [look], "host:1", planned)
    assert "    5 %  done" in text
    assert "   50 %  about 1500 documents" in text
    # 200 minutes into the step, 100 Kafka documents: 0.5 a minute, 150 more take 5 hours.
    ran = replace(state, step_since_ms=now_ms - 200 * 60_000)
    assert step_lines(ran, [look], planned, now_ms)[1] == (
        "     25 %  100 of about 250 documents, about 5.0 hours more at the current rate"
    )
    # 10 minutes in: too soon to tell its rate; the plan's (25 % of 5 a minute): 2 hours.
    early = replace(state, step_since_ms=now_ms - 10 * 60_000)
    assert "about 2.0 hours more" in step_lines(early, [look], planned, now_ms)[1]
