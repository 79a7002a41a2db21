"""Every Prometheus query of both dashboards, run against a real Prometheus scraping a real
sidecar whose workload makes every verdict kind, dead letters and skipped tasks, with a state
store of its own that has a maxmemory (as RAGFlow's Valkey and compose's sidecar-state do).

Prometheus is Debian's ``prometheus`` binary (``make system-deps`` installs it); without it this
test fails rather than skips, so CI cannot pass by not running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import valkey.asyncio as avalkey

from sidecar.app.metrics_catalog import MISMATCH_LABELS
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.dev.faults import Fault, FaultInjector
from sidecar.dev.local_stack import LocalValkey
from sidecar.rollout.machine import GateView, RolloutState, decide
from sidecar.rollout.store import RolloutStore
from sidecar.transport import KafkaProducer
from sidecar.transport.message import QueueMessage, encode_task
from sidecar.transport.topics import PARSE_TOPIC, init_topics
from tests.mirror_support import RAGFLOW_GROUP, ragflow_tasks
from tests.shadow_handlers import EXPLODE_MARKER
from tests.shadow_support import read_verdicts, running_sidecar, sidecar_settings
from tests.test_dashboards import (
    Target,
    label_values,
    metric_names,
    prometheus_targets,
    variable_queries,
)
from tests.test_metrics import free_port
from tests.test_shadow import enqueue

JOB = "ragflow-sidecar"
UP = f'up{{job="{JOB}"}}'
VERDICTS = f'ragflow_sidecar_verdicts_total{{job="{JOB}"}}'
PERCENT = 70.0
# What Grafana puts in place of its variables before a query reaches Prometheus.
GRAFANA_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
    "task_type": ".*",  # the drill-down's variable, "All"
}
# Count panels fall back to 0 when nothing happened (per-field panels to one series "none" at 0,
# dashboards.queries.or_none); without the fallback the query must still return data, or a
# misspelt metric would pass as "0".
FALLBACK = re.compile(
    r'\s+or\s+(?:on\(\)\s+label_replace\()?vector\(0\)(?:, "\w+", "none", "", ""\))?'
)
# The panels of mismatches: 0 on a healthy run, never "No data".
MISMATCH_METRICS = ("ragflow_sidecar_mismatches_total", "ragflow_sidecar_mismatched_fields_total")
INSTALL_HINT = (
    "the `prometheus` binary is not on PATH: run `make system-deps` (it installs Debian's "
    "prometheus package; CI runs it before the tests)"
)


def substitute(expr: str) -> str:
    """``expr`` with Grafana's variables (``$name`` or ``${name}``) replaced."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in GRAFANA_VARIABLES, f"no test value for ${name} in {expr}"
        return GRAFANA_VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def total(result: list[Any]) -> float:
    """The sum of an instant query's values (NaN, e.g. a quantile of no samples, counts 0)."""
    values = [float(series["value"][1]) for series in result if isinstance(series, dict)]
    values += [float(series[1]) for series in result if isinstance(series, list)]
    return sum(v for v in values if not math.isnan(v))


def http_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


class Prometheus:
    """A Prometheus on 127.0.0.1, read through its HTTP API (in a thread: the sidecar shares
    this test's event loop, and a blocked loop would fail the scrapes)."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        body = await asyncio.to_thread(http_json, url)
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, promql: str) -> list[Any]:
        """The result of an instant query: a list of series (a scalar counts as one)."""
        data = await self.get("/api/v1/query", query=promql)
        if data["resultType"] in {"scalar", "string"}:
            return [data["result"]]
        result: list[Any] = data["result"]
        return result

    async def value(self, promql: str) -> float | None:
        result = await self.query(promql)
        return float(result[0]["value"][1]) if result else None

    async def wait_for(self, what: str, promql: str, want: float, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        seen = None
        while time.monotonic() < deadline:
            seen = await self.value(promql)
            if seen is not None and seen >= want:
                return
            await asyncio.sleep(0.25)
        pytest.fail(f"Prometheus: {what}: `{promql}` is {seen}, waited for >= {want}")


@contextlib.contextmanager
def running_prometheus(tmp_path: Path, scrape_port: int) -> Iterator[tuple[str, Path]]:
    """Start ``prometheus`` scraping 127.0.0.1:``scrape_port`` every second; stop it by pid."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(INSTALL_HINT)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: {JOB}\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{scrape_port}']\n",
        encoding="utf-8",
    )
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited with {process.returncode}:\n{log_path.read_text()}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(base + "/-/ready", timeout=2) as ready,
            ):
                if ready.status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after 30 s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield base, log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


ROLLED_BACK = f'max(ragflow_sidecar_rollout_decisions_total{{job="{JOB}", action="rollback"}})'


async def autopilot_decides(settings: Settings, state: RolloutState | None) -> RolloutState:
    """What an autopilot records in the state store: its start (``state`` None), else a
    promotion to the next step and then a roll-back, so the rollout's panels have a phase and
    a step, and each annotation a change of the decisions' counter."""
    client = avalkey.Valkey(**settings.state.client_kwargs())
    store = RolloutStore(client, settings.serve.key_prefix, settings.state.display_url)
    plan, now_ms = settings.rollout, int(time.time() * 1000)
    try:
        if state is None:
            state, decision = decide(plan, RolloutState(), None, now_ms)
            await store.record(state, decision)
            return state
        promote = GateView(
            "promote", kafka_documents=plan.min_documents, redis_documents=plan.min_documents
        )
        state, decision = decide(plan, state, promote, now_ms + int(plan.dwell_s * 1000))
        await store.record(state, decision)
        rollback = GateView(
            "rollback", ("kafka fails more",), plan.min_documents, plan.min_documents
        )
        state, decision = decide(plan, state, rollback, now_ms + int(plan.dwell_s * 1000) + 1)
        await store.record(state, decision)
        return state
    finally:
        await client.aclose()


def in_share(task: dict[str, Any], priority: int) -> bool:
    return in_traffic_share(RouteTable().route(task, priority).key, PERCENT)


async def ragflow_worker_holding(
    client: avalkey.Valkey, stream: str, handled: int, hold_every: int = 4
) -> int:
    """RAGFlow's collect() and XACK; every ``hold_every``-th task is held for a few observer
    rounds, so the Redis path has processing times too (a quick ack has none)."""
    seen = 0
    deadline = time.monotonic() + 60
    while seen < handled and time.monotonic() < deadline:
        reply = await client.xreadgroup(RAGFLOW_GROUP, "worker_0", {stream: ">"}, count=1, block=5)
        for _, entries in reply or []:
            for entry_id, _fields in entries:
                seen += 1
                if seen % hold_every == 0:
                    await asyncio.sleep(0.3)
                await client.xack(stream, RAGFLOW_GROUP, entry_id)
        if not reply:
            await asyncio.sleep(0.005)
    return seen


async def one_round(
    settings: Settings,
    client: avalkey.Valkey,
    streams: tuple[str, str],
    plan: dict[str, Fault],
    round_no: int,
) -> int:
    """A hundred tasks over the two streams (some outside the share), one Kafka copy changed, one
    dropped and one doubled, one task whose handler raises, two broken entries and a Kafka
    record Redis never had. Returns the verdicts it makes."""
    high, low = streams
    tasks = ragflow_tasks(100)
    high_tasks, low_tasks = tasks[:10], tasks[10:]
    shared = [task for task in low_tasks if in_share(task, 0)]
    assert len(shared) < len(low_tasks), "the share should leave some tasks out"
    # Faults on parse tasks in both rounds: the same series grow (a new one starts at its value).
    parse = [task for task in shared if RouteTable().route(task, 0).task_type == "parse"]
    exploding, changed, dropped, doubled = parse[:4]
    exploding["digest"] = EXPLODE_MARKER  # the handler raises on both paths: an error verdict
    plan.update({changed["id"]: "change", dropped["id"]: "drop", doubled["id"]: "duplicate"})
    workers = [
        asyncio.create_task(ragflow_worker_holding(client, high, len(high_tasks))),
        asyncio.create_task(ragflow_worker_holding(client, low, len(low_tasks) + 2)),
    ]
    await enqueue(client, high, high_tasks)
    await enqueue(client, low, low_tasks)
    # Two broken entries for the mirror's DLQ: no `message` field, and a message that is no JSON.
    await client.xadd(low, {"not_message": b"x"})
    await client.xadd(low, {"message": b"{not json"})
    async with KafkaProducer(settings.kafka) as producer:  # missing_in_redis
        await producer.send(
            PARSE_TOPIC,
            encode_task(ragflow_tasks(1)[0]),
            key=b"orphan",
            headers=[("x-redis-stream", low.encode()), ("x-redis-id", f"{round_no}-0".encode())],
        )
    assert await asyncio.gather(*workers) == [len(high_tasks), len(low_tasks) + 2]
    # A final verdict per task in the share and for the orphan, and one duplicate verdict.
    return sum(in_share(task, 1) for task in high_tasks) + len(shared) + 2


async def test_every_dashboard_query_returns_data(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    tmp_path: Path,
    state_valkey: LocalValkey,
) -> None:
    targets = prometheus_targets()
    assert targets
    state = avalkey.Valkey(host="127.0.0.1", port=state_valkey.port)
    try:
        await state.config_set("maxmemory", 256 * 1024 * 1024)  # the state store panel's limit
    finally:
        await state.aclose()
    await init_topics(settings.kafka)
    streams = high, low = f"{unique}.1", f"{unique}.0"
    for stream in streams:
        await valkey_client.xgroup_create(stream, RAGFLOW_GROUP, id="0", mkstream=True)
    plan: dict[str, Fault] = {}

    def choose(message: QueueMessage) -> Fault | None:
        return plan.get(message.payload["id"])

    metrics_port = free_port()
    config = sidecar_settings(
        settings,
        [high, low],
        unique,
        SHADOW_HANDLER="tests.shadow_handlers:explode_on_marker",
        KAFKA_TRAFFIC_PERCENT=str(PERCENT),
        SIDECAR_METRICS_PORT=str(metrics_port),
        SIDECAR_METRICS_HOST="127.0.0.1",
        SIDECAR_STATE_URL=f"redis://127.0.0.1:{state_valkey.port}/0",
    )
    rows: list[tuple[Target, int, int, float]] = []
    started = await autopilot_decides(config, None)
    with running_prometheus(tmp_path, metrics_port) as (base, log_path):
        prometheus = Prometheus(base)
        async with running_sidecar(config, transform=FaultInjector(choose)) as sidecar:
            await prometheus.wait_for("the sidecar is scraped", UP, 1)
            # Two rounds, each scraped before the next: a counter's first sample already holds
            # what happened before it, so only the second round shows in rate() and increase().
            expected = 0
            for round_no in (1, 2):
                expected += await one_round(settings, valkey_client, streams, plan, round_no)
                verdicts = await read_verdicts(settings, set(streams), expected=expected)
                published = sum(sidecar.judge.stats.by_type.values())
                assert published >= len(verdicts) == expected
                await prometheus.wait_for(
                    f"round {round_no}'s verdicts scraped", f"sum({VERDICTS})", published
                )
            kinds = Counter(v["verdict"] for v in verdicts)
            faults = ("mismatch", "missing_in_kafka", "missing_in_redis", "duplicate", "error")
            assert kinds == {"match": expected - 10, **dict.fromkeys(faults, 2)}, kinds
            # Two more scrapes after the last verdict, so every series has samples enough.
            scrapes = f"sum(count_over_time({UP}[10m]))"
            done = await prometheus.value(scrapes)
            assert done is not None
            await prometheus.wait_for("two more scrapes", scrapes, done + 2)
            grown = await prometheus.query(f"sum by (verdict) (increase({VERDICTS}[5m]))")
            by_kind = {s["metric"]["verdict"]: float(s["value"][1]) for s in grown}
            # missing_primary: the old name of missing_in_redis, exported beside it for one
            # release with the same value (docs/metrics.md, "Renamed after 0.1.0").
            assert {kind for kind, value in by_kind.items() if value > 0} == {
                "match",
                *faults,
                "missing_primary",
            }, grown
            assert by_kind["missing_primary"] == by_kind["missing_in_redis"], grown
            # The autopilot's promotion and roll-back, late enough that the annotations' window
            # ($__rate_interval: 1m) still holds them when the queries run; the sidecar reads
            # the record every 10 s.
            assert await prometheus.value(ROLLED_BACK) == 0
            await autopilot_decides(config, started)
            await prometheus.wait_for("the roll-back scraped", ROLLED_BACK, 1, timeout_s=40)
            done = await prometheus.value(scrapes)
            assert done is not None
            await prometheus.wait_for("two scrapes after it", scrapes, done + 2)

            names = {name for target in targets for name in metric_names(target.expr)}
            for name in sorted(names):
                assert await prometheus.value(f'count({name}{{job="{JOB}"}})'), f"no {name}"
            for target in targets:
                expr = substitute(target.expr)
                full = len(await prometheus.query(expr))
                bare = await prometheus.query(FALLBACK.sub("", expr))
                rows.append((target, full, len(bare), total(bare)))
            for dashboard, query in variable_queries():
                metric, label = label_values(query)
                values = await prometheus.get(
                    f"/api/v1/label/{label}/values", **{"match[]": metric}
                )
                assert values, (dashboard, query)
            # A name that does not exist gives no data, so a typo could not pass the loop above.
            assert await prometheus.query("sum(rate(ragflow_sidecar_verdict_total[1m]))") == []
        assert "level=error" not in log_path.read_text(), log_path.read_text()

    width = max(len(t.panel) for t, *_ in rows)
    print(f"\n{'dashboard':<31} {'panel':<{width}} {'type':<10} ref series no-fallback   sum")
    for t, full, count, value in rows:
        print(
            f"{t.dashboard:<31} {t.panel:<{width}} {t.panel_type:<10} {t.ref:<3} {full:>6} "
            f"{count:>11} {value:>9.4g}"
        )
    empty = [f"{t.dashboard} / {t.panel} ({t.ref}): {t.expr}" for t, _, n, _ in rows if not n]
    assert not empty, "queries without data:\n" + "\n".join(empty)


async def test_on_a_fresh_start_the_mismatch_panels_read_0(
    settings: Settings, unique: str, tmp_path: Path
) -> None:
    """Before any mismatch (here before any task at all) the mismatch counter is there at 0 for
    every comparator and known task type, and every panel over it or over the mismatched
    fields reads 0 rather than "No data"."""
    await init_topics(settings.kafka)
    metrics_port = free_port()
    config = sidecar_settings(
        settings,
        [f"{unique}.1", f"{unique}.0"],
        unique,
        SIDECAR_METRICS_PORT=str(metrics_port),
        SIDECAR_METRICS_HOST="127.0.0.1",
    )
    targets = [t for t in prometheus_targets() if set(metric_names(t.expr)) & set(MISMATCH_METRICS)]
    assert {t.panel for t in targets} >= {"Mismatches by field", "Mismatches by comparator"}
    with running_prometheus(tmp_path, metrics_port) as (base, _):
        prometheus = Prometheus(base)
        async with running_sidecar(config):
            await prometheus.wait_for("the sidecar is scraped", UP, 1)
            scrapes = f"sum(count_over_time({UP}[10m]))"
            await prometheus.wait_for("three scrapes, for rate()", scrapes, 3)
            series = await prometheus.query(f'ragflow_sidecar_mismatches_total{{job="{JOB}"}}')
            labels = {(s["metric"]["comparator"], s["metric"]["task_type"]) for s in series}
            assert labels == set(MISMATCH_LABELS)
            assert total(series) == 0
            for target in targets:
                result = await prometheus.query(substitute(target.expr))
                assert result, f"{target.dashboard} / {target.panel}: no data"
                assert total(result) == 0, (target.panel, result)
