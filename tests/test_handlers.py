"""Handlers: loading by spec, running them safely, and the RAGFlow dry run. Pure unit tests."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sidecar.dev.samples import ragflow_tasks
from sidecar.errors import ConfigError
from sidecar.shadow.handlers import (
    NamedHandler,
    TaskMeta,
    load_handler,
    noop,
    ragflow_dry_run,
    run_handler,
)

REDIS_META = TaskMeta(
    path="redis",
    stream="te.0.common",
    entry_id="1787379303123-0",
    topic=None,
    partition=None,
    offset=None,
    attempt=1,
    cancelled=False,
)
KAFKA_META = TaskMeta(
    path="kafka",
    stream="te.0.common",
    entry_id="1787379303123-0",
    topic="ragflow.task.parse",
    partition=3,
    offset=41,
    attempt=2,
    cancelled=False,
)
CANCELLED_META = TaskMeta("redis", "te.0.common", "1-0", None, None, None, 1, cancelled=True)

# --- custom handlers, loaded back through "tests.test_handlers:..." specs ---------------------

SEEN_THREADS: list[int] = []
NOT_CALLABLE = 42


def sync_handler(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    SEEN_THREADS.append(threading.get_ident())
    return {"id": task.get("id"), "path": meta.path, "pair": (1, 2)}


async def async_handler(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    await asyncio.sleep(0.05)
    return {"async": True, "attempt": meta.attempt}


def sync_returning_coroutine(task: dict[str, Any], meta: TaskMeta) -> Any:
    return async_handler(task, meta)


def blocking_handler(task: dict[str, Any], meta: TaskMeta) -> str:
    time.sleep(0.3)  # would freeze the event loop if not run in a thread
    return "slept"


def raising_handler(task: dict[str, Any], meta: TaskMeta) -> None:
    raise ValueError("boom")


async def async_raising_handler(task: dict[str, Any], meta: TaskMeta) -> None:
    raise KeyError("doc_id")


def object_handler(task: dict[str, Any], meta: TaskMeta) -> object:
    return {"value": object()}


def nan_handler(task: dict[str, Any], meta: TaskMeta) -> float:
    return math.nan


def mutating_handler(task: dict[str, Any], meta: TaskMeta) -> int:
    task["doc_id"] = "changed"
    task.clear()
    return 1


async def slow_handler(task: dict[str, Any], meta: TaskMeta) -> None:
    await asyncio.sleep(10)


class AsyncCallable:
    async def __call__(self, task: dict[str, Any], meta: TaskMeta) -> str:
        return "called"


class Namespace:
    @staticmethod
    def handle(task: dict[str, Any], meta: TaskMeta) -> str:
        return "nested"


async_callable = AsyncCallable()

SPEC = "tests.test_handlers"


# --- load_handler -----------------------------------------------------------------------------


def test_default_is_ragflow() -> None:
    handler = load_handler()
    assert (handler.name, handler.func, handler.is_async, handler.builtin) == (
        "ragflow",
        ragflow_dry_run,
        False,
        True,
    )
    assert load_handler("  ").func is ragflow_dry_run
    assert load_handler("ragflow").func is ragflow_dry_run


def test_noop_spec() -> None:
    handler = load_handler("noop")
    assert (handler.name, handler.func, handler.builtin) == ("noop", noop, True)
    assert noop({}, REDIS_META) == noop(ragflow_tasks(1)[0], KAFKA_META) == {"ok": True}


@pytest.mark.parametrize(
    ("attr", "is_async"),
    [("sync_handler", False), ("async_handler", True), ("async_callable", True), ("Namespace.handle", False)],
)  # fmt: skip
def test_custom_specs(attr: str, is_async: bool) -> None:
    handler = load_handler(f" {SPEC}:{attr} ")
    assert handler.name == f"{SPEC}:{attr}"
    assert handler.is_async is is_async
    assert handler.builtin is False
    assert callable(handler.func)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("ragflowx", "not 'ragflow', 'noop'"),
        ("tests.test_handlers.sync_handler", "package.module:callable"),
        (":sync_handler", "package.module:callable"),
        ("tests.test_handlers:", "package.module:callable"),
        ("tests.test_handlers:a:b", "package.module:callable"),
        ("no_such_module_9f3c:handle", "module 'no_such_module_9f3c' not found"),
        ("tests.no_such_module_9f3c:handle", "module 'tests.no_such_module_9f3c' not found"),
        ("tests.test_handlers:missing_handler", "no attribute 'missing_handler'"),
        ("tests.test_handlers:Namespace.missing", "no attribute 'Namespace.missing'"),
        ("tests.test_handlers:NOT_CALLABLE", "is not callable (it is of type int)"),
    ],
)  # fmt: skip
def test_bad_specs(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_handler(spec)
    assert caught.value.variable == "SHADOW_HANDLER"
    assert str(caught.value).startswith("SHADOW_HANDLER: ")
    assert says in caught.value.problem


def _write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    name = f"handler_mod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_module_from_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _write_module(
        tmp_path, monkeypatch, "async def handle(task, meta):\n    return {'from': 'tmp'}\n"
    )
    handler = load_handler(f"{name}:handle")
    assert handler.is_async
    assert asyncio.run(handler.func({}, REDIS_META)) == {"from": "tmp"}


def test_module_whose_import_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing_dep = _write_module(tmp_path, monkeypatch, "import no_such_dep_9f3c\n")
    with pytest.raises(ConfigError) as caught:
        load_handler(f"{missing_dep}:handle")
    assert caught.value.variable == "SHADOW_HANDLER"
    assert f"importing '{missing_dep}' failed" in caught.value.problem
    assert "no_such_dep_9f3c" in caught.value.problem

    broken = _write_module(tmp_path, monkeypatch, "raise RuntimeError('bad config')\n")
    with pytest.raises(ConfigError, match=r"SHADOW_HANDLER: .*RuntimeError: bad config"):
        load_handler(f"{broken}:handle")


# --- run_handler ------------------------------------------------------------------------------


async def test_sync_custom_handler_runs_in_a_thread() -> None:
    SEEN_THREADS.clear()
    task = ragflow_tasks(1)[0]
    result = await run_handler(load_handler(f"{SPEC}:sync_handler"), task, KAFKA_META)
    assert result.error is None
    assert result.ok
    # JSON round trip: the tuple comes back as a list.
    assert result.outcome == {"id": task["id"], "path": "kafka", "pair": [1, 2]}
    assert SEEN_THREADS
    assert SEEN_THREADS[-1] != threading.get_ident()


async def test_blocking_sync_handler_does_not_block_the_loop() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    try:
        result = await run_handler(load_handler(f"{SPEC}:blocking_handler"), {}, REDIS_META)
    finally:
        tick_task.cancel()
    assert result.outcome == "slept"
    assert result.elapsed_ms >= 250
    assert ticks >= 5


async def test_builtin_handlers_run_inline() -> None:
    seen: list[int] = []

    def inline(task: dict[str, Any], meta: TaskMeta) -> str:
        seen.append(threading.get_ident())
        return "inline"

    handler = NamedHandler("inline", inline, is_async=False, builtin=True)
    result = await run_handler(handler, {}, REDIS_META)
    assert result.outcome == "inline"
    assert seen == [threading.get_ident()]


@pytest.mark.parametrize("attr", ["async_handler", "sync_returning_coroutine"])
async def test_awaitables_are_awaited(attr: str) -> None:
    result = await run_handler(load_handler(f"{SPEC}:{attr}"), {}, KAFKA_META)
    assert result.error is None
    assert result.outcome == {"async": True, "attempt": 2}
    assert result.elapsed_ms >= 40


async def test_async_callable_instance() -> None:
    result = await run_handler(load_handler(f"{SPEC}:async_callable"), {}, REDIS_META)
    assert (result.outcome, result.error) == ("called", None)


@pytest.mark.parametrize(
    ("attr", "error"),
    [("raising_handler", "ValueError: boom"), ("async_raising_handler", "KeyError: 'doc_id'")],
)
async def test_raising_handler_is_an_error_not_an_exception(attr: str, error: str) -> None:
    result = await run_handler(load_handler(f"{SPEC}:{attr}"), {}, REDIS_META)
    assert result.outcome is None
    assert result.error == error
    assert not result.ok
    assert result.elapsed_ms >= 0


@pytest.mark.parametrize("attr", ["object_handler", "nan_handler"])
async def test_unserialisable_outcome(attr: str) -> None:
    result = await run_handler(load_handler(f"{SPEC}:{attr}"), {}, REDIS_META)
    assert result.outcome is None
    assert result.error is not None
    assert result.error.startswith("not JSON-serialisable: ")


async def test_custom_handler_gets_its_own_copy() -> None:
    task = ragflow_tasks(1)[0]
    before = json.dumps(task)
    result = await run_handler(load_handler(f"{SPEC}:mutating_handler"), task, REDIS_META)
    assert result.outcome == 1
    assert json.dumps(task) == before


async def test_cancellation_propagates() -> None:
    running = asyncio.create_task(run_handler(load_handler(f"{SPEC}:slow_handler"), {}, REDIS_META))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_ragflow_handler_through_run_handler() -> None:
    task = ragflow_tasks(1)[0]
    result = await run_handler(load_handler(), task, REDIS_META)
    assert result.error is None
    assert result.outcome == ragflow_dry_run(task, REDIS_META)
    assert result.outcome["decision"] == "process"


# --- ragflow_dry_run: the five shapes RAGFlow queues ------------------------------------------


def test_the_five_sample_shapes_are_processed() -> None:
    tasks = ragflow_tasks(5)
    outcomes = [ragflow_dry_run(task, REDIS_META) for task in tasks]
    assert [o["kind"] for o in outcomes] == ["parse", "dataset", "dataset", "dataflow", "memory"]
    for task, outcome in zip(tasks, outcomes, strict=True):
        assert outcome["decision"] == "process", outcome
        assert outcome["collect"] == "returns_task"
        assert outcome["problems"] == []
        assert outcome["id"] == task["id"]
        json.dumps(outcome, allow_nan=False)  # JSON-safe as it is
        # Both paths give the same outcome for the same message.
        assert ragflow_dry_run(task, KAFKA_META) == outcome

    parse, dataset, per_doc, dataflow, memory = outcomes
    assert (parse["doc_id"], parse["from_page"], parse["to_page"]) == (tasks[0]["doc_id"], 0, 12)
    assert parse["task_type"] == ""
    assert (dataset["scope"], dataset["doc_id"], dataset["doc_ids_count"]) == (
        "dataset",
        "graph_raptor_x",
        2,
    )
    assert (per_doc["scope"], per_doc["doc_id"], per_doc["doc_ids_count"]) == (
        "document",
        tasks[2]["doc_id"],
        1,
    )
    assert {k: dataflow[k] for k in ("kb_id", "tenant_id", "dataflow_id", "canvas_debug")} == {
        "kb_id": "kb1",
        "tenant_id": "tenant-7",
        "dataflow_id": "df1",
        "canvas_debug": False,
    }
    assert (memory["memory_id"], memory["tenant_id"], memory["source_id"]) == (
        "mem1",
        "tenant-7",
        1042,
    )


def test_volatile_fields_do_not_matter() -> None:
    task = ragflow_tasks(1)[0]
    later = {
        **task,
        "begin_at": "2031-01-01 00:00:00",
        "create_time": 1,
        "update_date": "2031-01-01 00:00:00",
        "digest": "0000",
        "progress": 0.5,
    }
    assert ragflow_dry_run(later, REDIS_META) == ragflow_dry_run(task, KAFKA_META)
    # ...but what processing uses does.
    assert ragflow_dry_run({**task, "to_page": 24}, REDIS_META) != ragflow_dry_run(task, REDIS_META)


def test_memory_outcome_holds_no_user_text() -> None:
    task = ragflow_tasks(5)[4]
    secret = "my password is hunter2"
    task["message_dict"] = {
        **task["message_dict"],
        "user_input": secret,
        "agent_response": "I will not repeat hunter2",
        "session_id": "session-hunter2",
        "agent_id": "agent-hunter2",
        "user_id": "user-hunter2",
        secret: "a key that is user text",
    }
    outcome = ragflow_dry_run(task, REDIS_META)
    assert outcome["decision"] == "process"
    assert "hunter2" not in json.dumps(outcome)
    assert outcome["message_keys"] == sorted(
        ["agent_id", "agent_response", "session_id", "user_id", "user_input"]
    )
    assert outcome["message_other_keys"] == 1


# --- ragflow_dry_run: broken messages ---------------------------------------------------------

PARSE = {"id": "t1", "doc_id": "d1", "from_page": 0, "to_page": 12}
RAPTOR = {"id": "t2", "doc_id": "graph_raptor_x", "task_type": "raptor", "doc_ids": ["d1", "d2"]}
DATAFLOW = {
    "id": "t3",
    "doc_id": "d3",
    "task_type": "dataflow",
    "kb_id": "kb1",
    "tenant_id": "tn",
    "dataflow_id": "df1",
    "file": None,
}
MEMORY = {
    "id": "t4",
    "task_id": "t4",
    "task_type": "memory",
    "memory_id": "m1",
    "tenant_id": "tn",
    "source_id": 7,
    "message_dict": {"agent_id": "a", "session_id": "s", "user_input": "hi"},
}


def _without(task: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in task.items() if k != key}


@pytest.mark.parametrize(
    ("task", "kind", "decision", "collect", "problems"),
    [
        # Parse
        (_without(PARSE, "doc_id"), "parse", "reject", "returns_task", ["missing:doc_id"]),
        ({**PARSE, "doc_id": 17}, "parse", "reject", "returns_task", ["type:doc_id"]),
        ({**PARSE, "from_page": 12, "to_page": 0}, "parse", "reject", "returns_task", ["pages:inverted"]),
        ({**PARSE, "from_page": 5, "to_page": 5}, "parse", "reject", "returns_task", ["pages:empty"]),
        ({**PARSE, "from_page": -1}, "parse", "reject", "returns_task", ["pages:negative"]),
        ({**PARSE, "from_page": "0", "to_page": 12.0}, "parse", "reject", "returns_task", ["type:from_page", "type:to_page"]),
        ({**PARSE, "to_page": True}, "parse", "reject", "returns_task", ["type:to_page"]),
        (_without(PARSE, "to_page"), "parse", "reject", "returns_task", ["missing:to_page"]),
        (_without(PARSE, "id"), "parse", "reject", "raises", ["missing:id"]),
        ({**PARSE, "id": 5}, "parse", "reject", "acks_unknown", ["type:id"]),
        ({}, "unknown", "reject", "acks_empty", ["empty"]),
        # Task types
        ({**PARSE, "task_type": "summarise"}, "unknown", "reject", "returns_task", ["task_type:unknown"]),
        ({**PARSE, "task_type": None}, "unknown", "reject", "raises", ["type:task_type"]),
        ({**PARSE, "task_type": "evaluation"}, "unknown", "reject", "returns_task", ["task_type:unknown"]),
        # Dataset-wide
        (_without(RAPTOR, "doc_ids"), "dataset", "reject", "raises", ["missing:doc_ids"]),
        ({**RAPTOR, "doc_ids": []}, "dataset", "reject", "acks_unknown", ["fake_doc_id_without_doc_ids"]),
        ({**RAPTOR, "doc_ids": None}, "dataset", "reject", "acks_unknown", ["fake_doc_id_without_doc_ids"]),
        ({**RAPTOR, "doc_ids": [1, 2]}, "dataset", "reject", "acks_unknown", ["type:doc_ids"]),
        ({**RAPTOR, "doc_ids": ["d1", None]}, "dataset", "reject", "returns_task", ["type:doc_ids"]),
        ({**RAPTOR, "doc_ids": "d1"}, "dataset", "reject", "acks_unknown", ["type:doc_ids"]),
        ({**RAPTOR, "doc_ids": {"d1": 1}}, "dataset", "reject", "raises", ["type:doc_ids"]),
        ({**RAPTOR, "from_page": "x"}, "dataset", "reject", "returns_task", ["type:from_page"]),
        (_without(RAPTOR, "task_type"), "unknown", "reject", "raises", ["missing:task_type"]),
        ({**RAPTOR, "task_type": "summarise"}, "unknown", "reject", "returns_task", ["task_type:unknown"]),
        # Dataflow
        (_without(DATAFLOW, "tenant_id"), "dataflow", "reject", "raises", ["missing:tenant_id"]),
        (_without(DATAFLOW, "dataflow_id"), "dataflow", "reject", "raises", ["missing:dataflow_id"]),
        (_without(DATAFLOW, "kb_id"), "dataflow", "reject", "returns_task", ["missing:kb_id"]),
        ({**DATAFLOW, "kb_id": 3}, "dataflow", "reject", "returns_task", ["type:kb_id"]),
        # Memory
        (_without(MEMORY, "memory_id"), "memory", "reject", "raises", ["missing:memory_id"]),
        (_without(MEMORY, "source_id"), "memory", "reject", "raises", ["missing:source_id"]),
        (_without(MEMORY, "message_dict"), "memory", "reject", "raises", ["missing:message_dict"]),
        (_without(MEMORY, "tenant_id"), "memory", "reject", "returns_task", ["missing:tenant_id"]),
        ({**MEMORY, "source_id": "7"}, "memory", "reject", "returns_task", ["type:source_id"]),
        ({**MEMORY, "message_dict": "hi"}, "memory", "reject", "returns_task", ["type:message_dict"]),
        ({**MEMORY, "message_dict": {"user_input": "hi"}}, "memory", "reject", "returns_task", ["missing:message_dict.agent_id", "missing:message_dict.session_id"]),
        (_without(MEMORY, "id"), "memory", "reject", "raises", ["missing:id"]),
    ],
)  # fmt: skip
def test_broken_messages(
    task: dict[str, Any], kind: str, decision: str, collect: str, problems: list[str]
) -> None:
    outcome = ragflow_dry_run(task, REDIS_META)
    assert (outcome["kind"], outcome["decision"], outcome["collect"], outcome["problems"]) == (
        kind,
        decision,
        collect,
        problems,
    )
    assert ragflow_dry_run(task, KAFKA_META) == outcome
    json.dumps(outcome, allow_nan=False)


@pytest.mark.parametrize(
    ("task", "kind"),
    [
        (PARSE, "parse"),
        ({**PARSE, "from_page": 0, "to_page": 100000000}, "parse"),
        (RAPTOR, "dataset"),
        ({**RAPTOR, "task_type": "structure_graph"}, "dataset"),
        ({**RAPTOR, "task_type": "session_essence", "from_page": 100000000}, "dataset"),
        ({"id": "t5", "doc_id": "d5", "task_type": "raptor"}, "dataset"),
        (DATAFLOW, "dataflow"),
        ({**DATAFLOW, "task_type": "dataflow_rerun"}, "dataflow"),
        ({**DATAFLOW, "doc_id": "dataflow_x", "kb_id": None}, "dataflow"),
        (_without({**DATAFLOW, "doc_id": "dataflow_x"}, "kb_id"), "dataflow"),
        (MEMORY, "memory"),
    ],
)  # fmt: skip
def test_well_formed_variants(task: dict[str, Any], kind: str) -> None:
    outcome = ragflow_dry_run(task, REDIS_META)
    assert (outcome["kind"], outcome["decision"], outcome["problems"]) == (kind, "process", [])


def test_canvas_debug_dataflow() -> None:
    outcome = ragflow_dry_run({**DATAFLOW, "doc_id": "dataflow_x", "kb_id": ""}, REDIS_META)
    assert (outcome["canvas_debug"], outcome["kb_id"], outcome["decision"]) == (
        True,
        None,
        "process",
    )


@pytest.mark.parametrize("task", [*ragflow_tasks(5), {**DATAFLOW, "doc_id": "dataflow_x"}])
def test_cancelled(task: dict[str, Any]) -> None:
    outcome = ragflow_dry_run(task, CANCELLED_META)
    assert (outcome["decision"], outcome["collect"]) == ("cancelled", "acks_cancelled")
    assert outcome["problems"] == []
    # Apart from the decision, the outcome is the uncancelled one.
    uncancelled = ragflow_dry_run(task, REDIS_META)
    assert {k: v for k, v in outcome.items() if k not in ("decision", "collect")} == {
        k: v for k, v in uncancelled.items() if k not in ("decision", "collect")
    }


@pytest.mark.parametrize(
    ("task", "decision", "collect"),
    [
        # The cancel check comes after the lookup: what fails before it is unaffected...
        (_without(PARSE, "id"), "reject", "raises"),
        ({**RAPTOR, "doc_ids": []}, "reject", "acks_unknown"),
        ({}, "reject", "acks_empty"),
        # ...and what would fail after it never gets there.
        (_without(DATAFLOW, "tenant_id"), "cancelled", "acks_cancelled"),
        (_without(MEMORY, "memory_id"), "cancelled", "acks_cancelled"),
        ({**PARSE, "from_page": 20}, "cancelled", "acks_cancelled"),
    ],
)  # fmt: skip
def test_cancelled_against_broken(task: dict[str, Any], decision: str, collect: str) -> None:
    outcome = ragflow_dry_run(task, CANCELLED_META)
    assert (outcome["decision"], outcome["collect"]) == (decision, collect)
