"""The sidecar's traces in a real Jaeger: ``ragflow-sidecar run`` over RAGFlow-shaped traffic,
some tasks made to mismatch, and each task's story read back through Jaeger's query API.

Per sampled task, one trace holds the mirror's Redis read (``receive``), its produce (``send``),
and, children of the send, the redis run (``run redis``), the kafka run (``process``) and the
verdict (``compare``), the last two also linked to it (FOLLOWS_FROM in Jaeger); the verdict
names that trace (``trace_id``), which ``diffs`` prints. A bad verdict of an unsampled task is
a trace of its own, linked to the send's context.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import valkey.asyncio as avalkey

from sidecar.config import Settings
from sidecar.dev.local_stack.jaeger import LocalJaeger
from sidecar.dev.samples import ragflow_tasks
from tests.conftest import free_port
from tests.faults.support import (
    SidecarProcess,
    judged,
    ragflow_worker,
    ready,
    sidecar_env,
    valkey_url,
    wait_until,
)
from tests.jaeger_support import SERVICE, JaegerSpan, fetch, search
from tests.mirror_support import prepare_stream
from tests.shadow_handlers import MISMATCH_MARKER

TIMEOUT_S = 180


@contextmanager
def sidecar_run(
    settings: Settings, stream: str, unique: str, jaeger: LocalJaeger, log: Path, **extra: str
) -> Iterator[tuple[SidecarProcess, int]]:
    """``ragflow-sidecar run`` on ``stream``, tracing to ``jaeger``; its metrics port."""
    port = free_port()
    env = sidecar_env(
        valkey_url(settings),
        ",".join(settings.kafka.bootstrap_servers),
        stream,
        unique,
        SIDECAR_METRICS_PORT=str(port),
        SHADOW_HANDLER="tests.shadow_handlers:kafka_differs_on_marker",
        # Only the traces: Jaeger takes no OTLP metrics.
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=jaeger.otlp_grpc_endpoint,
        **extra,
    )
    with SidecarProcess(["run"], env, log) as sidecar:
        yield sidecar, port


async def _traffic(
    settings: Settings,
    client: avalkey.Valkey,
    stream: str,
    tasks: list[dict[str, Any]],
    sidecar: SidecarProcess,
    port: int,
) -> dict[str, dict[str, Any]]:
    """XADD ``tasks`` once the sidecar is ready, consume them as RAGFlow does, and return the
    final verdicts by task id once every task has one; the sidecar is then stopped (which
    exports its last spans)."""
    await wait_until(lambda: ready(port), "the sidecar to be ready", timeout_s=TIMEOUT_S)
    for task in tasks:
        await client.xadd(stream, {"message": json.dumps(task)})
    handled = await ragflow_worker(client, stream, len(tasks))
    assert len(handled) == len(tasks)
    verdicts = await judged(settings, stream, len(tasks), TIMEOUT_S)
    assert sidecar.stop() == 0
    return {v["task_id"]: v for v in verdicts if v["verdict"] != "duplicate"}


def _marked(total: int, every: int) -> list[dict[str, Any]]:
    """RAGFlow-shaped tasks; every ``every``-th parse task's kafka run will differ."""
    tasks = ragflow_tasks(total)
    parse = [task for task in tasks if "to_page" in task and "task_type" not in task]
    for task in parse[::every]:
        task["digest"] = MISMATCH_MARKER
    return tasks


def _one(spans: list[JaegerSpan], name: str, task_id: str) -> JaegerSpan:
    found = {
        s.span_id: s
        for s in spans
        if (s.name == name or s.name.startswith(name + " ")) and s.tags.get("task.id") == task_id
    }
    assert len(found) == 1, (name, task_id, [s.name for s in spans])
    return next(iter(found.values()))


def _strings(value: Any) -> list[str]:
    """A string-array attribute as Jaeger shows it (a JSON array in a string tag)."""
    parsed = json.loads(value) if isinstance(value, str) else value
    assert isinstance(parsed, list), value
    return [str(item) for item in parsed]


async def test_each_tasks_trace_from_the_redis_read_to_the_verdict_in_jaeger(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    jaeger: LocalJaeger,
    tmp_path: Path,
) -> None:
    stream = f"{unique}.0"
    await prepare_stream(settings, valkey_client, stream)
    tasks = _marked(12, every=1)
    marked = {task["id"] for task in tasks if task.get("digest") == MISMATCH_MARKER}
    assert len(marked) >= 2
    with sidecar_run(
        settings,
        stream,
        unique,
        jaeger,
        tmp_path / "sidecar.log",
        OTEL_TRACES_SAMPLER="parentbased_always_on",
    ) as (sidecar, port):
        verdicts = await _traffic(settings, valkey_client, stream, tasks, sidecar, port)
    assert {t for t, v in verdicts.items() if v["verdict"] == "mismatch"} == marked
    assert {v["verdict"] for t, v in verdicts.items() if t not in marked} == {"match"}

    stories: dict[str, list[JaegerSpan]] = {}

    async def every_story_told() -> bool:
        for task in tasks:
            spans = await search(jaeger, **{"task.id": task["id"]})
            names = {s.name.split(" ")[0] for s in spans if s.tags.get("task.id") == task["id"]}
            if not {"send", "run", "process", "compare"} <= names:
                return False
            stories[task["id"]] = spans
        return True

    await wait_until(every_story_told, "every task's spans in Jaeger", TIMEOUT_S, 0.5)

    for task in tasks:
        task_id, spans = task["id"], stories[task["id"]]
        verdict = verdicts[task_id]
        send = _one(spans, "send", task_id)
        run = _one(spans, "run redis", task_id)
        process = _one(spans, "process", task_id)
        compare = _one(spans, "compare", task_id)
        for span in (send, run, process, compare):
            assert span.service == SERVICE
            assert span.resource["service.instance.id"] == f"sidecar-{unique}"
            assert span.tags["task.id"] == task_id
            assert span.tags.get("task.type", "") == verdict["task_type"]
            assert span.tags["messaging.message.id"] == verdict["entry_id"]
        # One trace: the Redis read, the produce and the redis run.
        receive = {s.span_id: s for s in spans}[send.parent[1]] if send.parent else None
        assert receive is not None and receive.name == f"receive {stream}"
        assert receive.tags["messaging.system"] == "redis" and receive.parent is None
        assert run.parent == send.context and run.tags["task.path"] == "redis"
        assert send.tags["messaging.system"] == "kafka"
        assert send.tags["messaging.kafka.offset"] == verdict["offset"]
        # The kafka run and the verdict: the same trace, children of the produce and linked to
        # it (Jaeger keeps one reference per span it points at: a FOLLOWS_FROM for the link).
        assert process.tags["task.path"] == "kafka"
        assert process.trace_id == compare.trace_id == send.trace_id
        assert process.references == {send.context}
        assert compare.references == {send.context, process.context}
        assert compare.tags["verdict"] == verdict["verdict"]
        # The verdict names the task's trace, and Jaeger answers with all of it by that id.
        assert verdict["trace_id"] == compare.trace_id == send.trace_id
        by_id = {s.span_id for s in await fetch(jaeger, verdict["trace_id"])}
        assert {s.span_id for s in (receive, send, run, process, compare)} <= by_id
        if task_id in marked:
            assert _strings(compare.tags["verdict.difference_kinds"]) == ["value_changed"]
            found = sorted(name for name, n in verdict["comparators"].items() if n)
            assert found and _strings(compare.tags["verdict.comparators"]) == found
            [diff] = [e for e in compare.events if e.get("event") == "diff"]
            differences = json.loads(diff["differences"])
            assert {(d["path"], d["kind"]) for d in differences} == {("to_page", "value_changed")}
            assert verdict["differences"][0]["path"] == "to_page"
        else:
            assert "verdict.difference_kinds" not in compare.tags
            assert not [e for e in compare.events if e.get("event") == "diff"]


async def test_at_ten_percent_sampling_every_mismatch_keeps_its_trace(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    unique: str,
    jaeger: LocalJaeger,
    tmp_path: Path,
) -> None:
    """Head sampling at 10 %, decided per mirrored batch (one entry each here): a task is
    traced from the Redis read to its verdict or not at all, except that a mismatch's compare
    span is always exported. Every mismatch's verdict names a trace Jaeger has, holding that
    span with its kinds and its link to the task's produce; a match names one only when its
    task was sampled, and then Jaeger has the whole story."""
    stream = f"{unique}.0"
    await prepare_stream(settings, valkey_client, stream)
    tasks = _marked(30, every=2)
    marked = {task["id"] for task in tasks if task.get("digest") == MISMATCH_MARKER}
    with sidecar_run(
        settings,
        stream,
        unique,
        jaeger,
        tmp_path / "sidecar.log",
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="0.1",
        MIRROR_BATCH="1",
    ) as (sidecar, port):
        verdicts = await _traffic(settings, valkey_client, stream, tasks, sidecar, port)
    assert {t for t, v in verdicts.items() if v["verdict"] == "mismatch"} == marked
    traced = {t: v["trace_id"] for t, v in verdicts.items() if v["trace_id"]}
    assert marked <= set(traced)
    # Sampling is at work: 3 mismatches, 27 matches each sampled at 10 %.
    assert set(traced) - marked != set(verdicts) - marked

    stories: dict[str, list[JaegerSpan]] = {}

    async def every_named_trace_stored() -> bool:
        for task_id, trace_id in traced.items():
            spans = await search(jaeger, **{"task.id": task_id})
            if not any(s.name == "compare" and s.trace_id == trace_id for s in spans):
                return False
            stories[task_id] = spans
        return True

    await wait_until(every_named_trace_stored, "each named trace in Jaeger", TIMEOUT_S, 0.5)

    for task_id, trace_id in traced.items():
        spans = stories[task_id]
        compare = _one(spans, "compare", task_id)
        assert compare.trace_id == trace_id and [s.trace_id for s in await fetch(jaeger, trace_id)]
        sends = [s for s in spans if s.name.startswith("send ") and s.tags["task.id"] == task_id]
        if task_id in marked:
            assert compare.tags["verdict"] == "mismatch"
            assert _strings(compare.tags["verdict.difference_kinds"]) == ["value_changed"]
            # Linked to the record's producer context, sampled or not.
            assert compare.links and all(len(t) == 32 for t, _ in compare.links)
        else:
            assert compare.tags["verdict"] == "match"
        if sends:  # the task was sampled: its whole story is there, one trace
            [send] = sends
            assert send.context in compare.references and trace_id == send.trace_id
            assert _one(spans, "run redis", task_id).parent == send.context
            assert _one(spans, "process", task_id).references == {send.context}
        else:  # only a mismatch's compare span outlives an unsampled task: a trace of its own
            assert task_id in marked and compare.parent is None
            assert all(trace != trace_id for trace, _ in compare.links)
            assert [s.name for s in spans if s.tags.get("task.id") == task_id] == ["compare"]
    # A match whose task was not sampled has no span in Jaeger at all.
    for task_id in set(verdicts) - set(traced):
        assert not [s for s in await search(jaeger, **{"task.id": task_id})]
