"""``install()`` in one process with the RAGFlow stand-in: what it leaves unchanged, what it
refuses, and what it does when Kafka is away."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import valkey

import ragflow_mq
from ragflow_mq.loop import BackgroundLoop
from ragflow_mq.producer import ServeProducer
from ragflow_mq.recorder import Recorder
from ragflow_mq.spread import Spread
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.dev.local_stack import LocalStack
from sidecar.dev.local_stack.valkey import LocalValkey
from tests.conftest import free_port
from tests.ragflow_support import STANDIN_ROOT, StandinProcess, standin_env, wait_until
from tests.serve_support import make_world

pytestmark = [pytest.mark.kafka39, pytest.mark.ragflow_pins]

GROUP = "rag_flow_svr_task_broker"


@pytest.fixture
def redis_conn(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-in's ``rag.utils.redis_conn``, imported in this process."""
    monkeypatch.setenv("REDIS_URL", stack.valkey.url)
    monkeypatch.syspath_prepend(str(STANDIN_ROOT))
    module = importlib.import_module("rag.utils.redis_conn")
    yield module
    ragflow_mq.uninstall()


def _tasks(doc: str, count: int) -> list[dict[str, Any]]:
    # Fixed content, so that two runs can be compared byte for byte.
    return [
        {"id": f"{doc}{i:04d}", "doc_id": doc, "from_page": 12 * i, "to_page": 12 * i + 12,
         "progress": 0.0, "name": "caf\u00e9 \u6587\u6863.pdf", "priority": 0}
        for i in range(count)
    ]  # fmt: skip


class _Monitor:
    """Every command Valkey executes while the block runs, as text."""

    def __init__(self, url: str) -> None:
        self._client = valkey.Valkey.from_url(url)
        self.commands: list[str] = []
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._ready = threading.Event()

    def _listen(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            for event in monitor.listen():
                command = str(event["command"])
                if command.startswith("ECHO") and "monitor-stop" in command:
                    return
                self.commands.append(command)

    def __enter__(self) -> _Monitor:
        self._thread.start()
        self._ready.wait(10)
        self._client.ping()  # the monitor's connection is live before anything is measured
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.echo("monitor-stop")
        self._thread.join(10)
        self._client.close()


def _run_ragflow(module: ModuleType, prefix: str, docs: int) -> None:
    """What RAGFlow's API and one executor do: queue, then collect, handle and ack all."""
    conn = module.REDIS_CONN
    high, low = f"{prefix}.te.1.common", f"{prefix}.te.0.common"
    for d in range(docs):
        for task in _tasks(f"doc{d}", 3):
            assert conn.queue_product(low, task)
    list(conn.get_unacked_iterator([high, low], GROUP, "task_executor_common_x_0"))
    handled = 0
    while handled < docs * 3:
        for queue in (high, low):
            message = conn.queue_consumer(queue, GROUP, "task_executor_common_x_0")
            if message is not None:
                assert message.get_message()["doc_id"].startswith("doc")
                assert message.ack()
                handled += 1
                break


def _normalise(commands: list[str], prefix: str) -> list[str]:
    """RAGFlow's commands on its own keys, with this run's names and entry ids replaced."""
    ours = [c for c in commands if prefix in c]
    return [re.sub(r"\d{13}-\d+", "<id>", c.replace(prefix, "<p>")) for c in ours]


async def test_redis_traffic_is_byte_identical_without_install_and_at_zero_percent(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    world = await make_world(stack, unique, tmp_path)
    client = valkey.Valkey.from_url(stack.valkey.url)
    runs: dict[str, tuple[list[str], list[Any]]] = {}
    for label in ("without", "zero"):
        prefix = f"{unique}{label}"
        if label == "zero":
            settings = Settings.from_env(
                {**world.env, "KAFKA_SERVE_PERCENT": "0",
                 "MIRROR_STREAMS": f"{prefix}.te.1.common,{prefix}.te.0.common"}
            )  # fmt: skip
            assert ragflow_mq.install(settings)
            assert redis_conn.REDIS_CONN.queue_product != type(redis_conn.REDIS_CONN).queue_product
        with _Monitor(stack.valkey.url) as monitor:
            _run_ragflow(redis_conn, prefix, docs=5)
        entries = [fields for _id, fields in client.xrange(f"{prefix}.te.0.common")]
        runs[label] = (_normalise(monitor.commands, prefix), entries)
        ragflow_mq.uninstall()
    assert runs["without"][1] == runs["zero"][1], "the stream entries differ"
    assert runs["without"][0] == runs["zero"][0], "RAGFlow's Redis commands differ"
    names = {c.split()[0].strip('"').upper() for c in runs["zero"][0]}
    assert {"XADD", "XREADGROUP", "XACK"} <= names, names
    client.close()


def test_install_with_redis_backend_touches_nothing(redis_conn: ModuleType) -> None:
    before = dict(vars(redis_conn.REDIS_CONN))
    assert ragflow_mq.install(Settings.from_env({"MQ_BACKEND": "redis"})) is False
    assert dict(vars(redis_conn.REDIS_CONN)) == before


@pytest.mark.parametrize(
    ("variable", "value", "extra"),
    [
        ("MQ_BACKEND", "kafak", {}),
        ("KAFKA_SERVE_PERCENT", "150", {"MQ_BACKEND": "split"}),
        ("KAFKA_SERVE_PERCENT", "60", {"MQ_BACKEND": "split", "KAFKA_TRAFFIC_PERCENT": "50"}),
        ("KAFKA_SERVE_PERCENT", "ten", {"MQ_BACKEND": "split"}),
        ("SERVE_PREFETCH", "50", {"MQ_BACKEND": "split", "MAX_CONCURRENT_TASKS": "5"}),
    ],
)
def test_a_broken_setting_stops_the_ragflow_process_naming_the_variable(
    stack: LocalStack, unique: str, tmp_path: Path, variable: str, value: str,
    extra: dict[str, str],
) -> None:  # fmt: skip
    env = standin_env(stack, prefix=unique, results_key=unique, install=True,
                      extra={**extra, variable: value})  # fmt: skip
    with StandinProcess.executor(env, tmp_path, "task_executor_common_bad_0") as process:
        assert process.wait(60) == 2
        log = process.log_text()
    assert f"ragflow_mq: error: {variable}" in log, log
    assert "Traceback" not in log


async def test_kafka_away_at_produce_time_sends_the_task_to_redis_within_the_bound(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    """RAGFlow's API never waits on Kafka: the first task tries Kafka for at most
    SERVE_ENQUEUE_TIMEOUT_MS, is marked as Redis's (so a late record of it would be skipped)
    and goes to Redis; the breaker sends the next ones there without trying."""
    world = await make_world(stack, unique, tmp_path)
    values = {**world.env, "KAFKA_SERVE_PERCENT": "100", "SERVE_ENQUEUE_TIMEOUT_MS": "800",
              "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}  # fmt: skip
    assert ragflow_mq.install(Settings.from_env(values))
    tasks = _tasks("docaway", 3)
    took = []
    for task in tasks:
        started = time.monotonic()
        assert redis_conn.REDIS_CONN.queue_product(world.streams[1], task) is True
        took.append(time.monotonic() - started)
    # The bound plus scheduling slack on a busy machine: far below one Kafka request timeout.
    assert max(took) < 0.8 + 1.0, took
    client = valkey.Valkey.from_url(stack.valkey.url)
    entries = client.xrange(world.streams[1])
    assert [json.loads(fields[b"message"])["id"] for _, fields in entries] == [
        t["id"] for t in tasks
    ]
    keys = ragflow_mq.Keys(unique)
    assert client.get(keys.done(tasks[0]["id"])) == b"redis"
    assert client.exists(keys.done(tasks[1]["id"])) == 0, "the breaker tried Kafka again"
    redis_conn.REDIS_CONN._ragflow_mq_runtime.flush_evidence()
    totals = client.hgetall(keys.evidence_total)
    assert int(totals[b"kafka:diverted"]) == 3
    assert int(totals[b"redis:produced"]) == 3
    client.close()
    # Back to a reachable Kafka: served tasks go there again. The producer was started at
    # install: cold, the first task paid its start inside the bound and, on a busy machine,
    # went to Redis for that alone. The bound is the default one: the 800 ms above were
    # the away case's, and a produce round trip to a starved broker can take longer.
    ragflow_mq.uninstall()
    assert ragflow_mq.install(Settings.from_env(world.env))
    runtime = redis_conn.REDIS_CONN._ragflow_mq_runtime
    assert await asyncio.to_thread(runtime.producer.warmed.wait, 60)
    assert redis_conn.REDIS_CONN.queue_product(world.streams[1], _tasks("docback", 1)[0])
    client = valkey.Valkey.from_url(stack.valkey.url)
    assert client.xlen(world.streams[1]) == 3
    client.close()


def test_the_sitecustomize_directory_ships_in_the_package() -> None:
    site = Path(ragflow_mq.__file__).parent / "sitecustomize" / "sitecustomize.py"
    assert "import ragflow_mq._sitecustomize" in site.read_text()


async def test_the_live_share_moves_under_the_ceiling_and_an_evicted_one_is_kept(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    assert ragflow_mq.install(Settings.from_env(world.env))
    runtime = redis_conn.REDIS_CONN._ragflow_mq_runtime
    client = valkey.Valkey.from_url(stack.valkey.url)
    keys = ragflow_mq.Keys(unique)
    assert runtime.percent() == 50  # never set: the ceiling
    client.set(keys.share, "20")
    runtime.read_share()
    assert runtime.percent() == 20
    client.set(keys.share, "80")  # written by hand: still never above the ceiling
    runtime.read_share()
    assert runtime.percent() == 50
    client.set(keys.share, "20")
    runtime.read_share()
    client.delete(keys.share)  # what an LRU eviction does
    runtime.read_share()
    assert runtime.percent() == 20, "a vanished live share raised the served share"
    client.set(keys.share, "banana")
    runtime.read_share()
    assert runtime.percent() == 50
    # The cap of an earlier build is honoured beside it: the lower of the two wins, and it
    # too is kept when it vanishes.
    client.set(keys.share, "30")
    client.set(keys.old_cap, "10")
    runtime.read_share()
    assert runtime.percent() == 10
    client.delete(keys.old_cap)
    runtime.read_share()
    assert runtime.percent() == 10, "a vanished old cap raised the served share"
    client.set(keys.old_cap, "100")  # what `shift` folds it into
    runtime.read_share()
    assert runtime.percent() == 30
    client.close()


async def test_a_share_that_cannot_be_read_serves_0_until_the_store_is_back_a_while(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    redis_conn: ModuleType,
    state_valkey: LocalValkey,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Started while the state store is down: 0, never the ceiling; the store back, 0 for
    RECOVERED_HOLD_S more (a roll-back written as it returns lands first), then the share;
    down again: 0 at once. One warning per outage, however many reads fail."""
    monkeypatch.setattr(ragflow_mq.share, "RECOVERED_HOLD_S", 1.0)
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    settings = Settings.from_env({**world.env, "SIDECAR_STATE_URL": state_valkey.url})
    state_valkey.stop()
    assert ragflow_mq.install(settings)
    runtime = redis_conn.REDIS_CONN._ragflow_mq_runtime
    assert runtime.percent() == 0, "a process started in the outage served the ceiling"
    for _ in range(3):
        runtime.read_share()
    assert runtime.percent() == 0
    state_valkey.start()
    runtime.read_share()
    assert runtime.percent() == 0, "served at once when the store came back"
    await asyncio.sleep(1.1)
    assert runtime.percent() == 50
    state_valkey.stop()
    runtime.read_share()
    assert runtime.percent() == 0
    warned = [r for r in caplog.records if "cannot read the live share" in r.getMessage()]
    assert len(warned) == 2, [r.getMessage() for r in warned]


async def test_a_state_store_that_hangs_at_start_holds_the_first_call_half_a_second_at_most(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    redis_conn: ModuleType,
    state_valkey: LocalValkey,
) -> None:
    """A store that accepts and never answers (SIGSTOP: a VM stall): the first decision waits
    for the share's first read only so long, then serves 0 (its task to Redis)."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = Settings.from_env({**world.env, "SIDECAR_STATE_URL": state_valkey.url})
    pid = state_valkey.process.pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        assert ragflow_mq.install(settings)
        started = time.monotonic()
        assert redis_conn.REDIS_CONN.queue_product(world.streams[1], _tasks(f"{unique}d", 1)[0])
        took_s = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert took_s < 1.5, f"the first queue_product took {took_s:.1f} s"
    client = valkey.Valkey.from_url(stack.valkey.url)
    assert client.xlen(world.streams[1]) == 1, "not on Redis"
    client.close()


async def test_the_split_factory_sends_served_keys_to_kafka_and_the_rest_to_redis(
    stack: LocalStack, unique: str, tmp_path: Path
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="50")
    settings = Settings.from_env(world.env)
    low = world.streams[1]
    tasks = [t for d in range(40) for t in _tasks(f"{unique}doc{d}", 2)]
    async with ragflow_mq.create_producer(settings) as producer:
        results = await producer.send_many([ragflow_mq.OutgoingMessage(low, t) for t in tasks])
    by_doc: dict[str, set[str]] = {}
    for task, result in zip(tasks, results, strict=True):
        assert not isinstance(result, Exception), result
        by_doc.setdefault(task["doc_id"], set()).add(result.destination)
    assert all(len(paths) == 1 for paths in by_doc.values()), "a document on both paths"
    destinations = {next(iter(paths)) for paths in by_doc.values()}
    assert destinations == {low, f"{unique}.tasks"}
    client = valkey.Valkey.from_url(stack.valkey.url)
    in_redis = {json.loads(f[b"message"])["doc_id"] for _, f in client.xrange(low)}
    client.close()
    assert in_redis == {doc for doc, paths in by_doc.items() if paths == {low}}


async def test_queue_info_counts_kafka_tasks_in_hand_as_pending(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    assert ragflow_mq.install(Settings.from_env(world.env))
    conn, low = redis_conn.REDIS_CONN, world.streams[1]
    for task in _tasks(f"{unique}doc", 2):
        assert conn.queue_product(low, task)
    deadline = time.monotonic() + 60
    message = None
    while message is None and time.monotonic() < deadline:
        list(conn.get_unacked_iterator(list(world.streams), GROUP, "task_executor_common_q_0"))
        message = conn.queue_consumer(low, GROUP, "task_executor_common_q_0")
    assert message is not None and ":" in message.get_msg_id()
    info = conn.queue_info(low, GROUP)
    assert info is not None and info["pending"] == 1  # none in Redis, one Kafka task in hand
    assert message.ack()
    assert conn.queue_info(low, GROUP)["pending"] == 0


async def test_queue_info_counts_the_served_backlog_in_lag(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    """RAGFlow's "tasks ahead in the queue" is the group's lag: served documents' tasks wait
    in Kafka, and count there too (here no stream exists at all: every task was served)."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    assert ragflow_mq.install(Settings.from_env(world.env))
    conn, high, low = redis_conn.REDIS_CONN, *world.streams
    for task in _tasks(f"{unique}doc", 3):
        assert conn.queue_product(low, task)
    assert conn.queue_product(high, _tasks(f"{unique}first", 1)[0])

    def lag(queue: str) -> int:
        return int((conn.queue_info(queue, GROUP) or {}).get("lag") or 0)

    await wait_until(lambda: (lag(high), lag(low)) == (1, 3), 30, what="a lag of 1 and 3 tasks")


def _memory_task(memory_id: str) -> dict[str, Any]:
    """A memory task (shape 5 of RAGFlow's queue): one on every agent turn of a conversation."""
    task_id = uuid.uuid1().hex
    return {"id": task_id, "task_id": task_id, "task_type": "memory", "memory_id": memory_id,
            "tenant_id": "t1", "source_id": 1042,
            "message_dict": {"user_id": "", "agent_id": "a1", "session_id": "s1",
                             "user_input": "hi", "agent_response": "hello"}}  # fmt: skip


async def test_a_lowered_live_share_takes_a_hot_key_off_kafka_within_the_refresh(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    """A memory with a task every 0.5 s and a sticky time of a minute: after the live share
    goes to 0, its tasks are on Redis within SERVE_SHARE_REFRESH_S (measured from the change,
    not from the key's last task, which is never more than 0.5 s ago)."""
    world = await make_world(stack, unique, tmp_path)
    refresh_s = 0.5
    values = {**world.env, "KAFKA_SERVE_PERCENT": "100", "SERVE_STICKY_S": "60",
              "SERVE_SHARE_REFRESH_S": str(refresh_s)}  # fmt: skip
    assert ragflow_mq.install(Settings.from_env(values))
    conn = redis_conn.REDIS_CONN
    client = valkey.Valkey.from_url(stack.valkey.url)
    low = world.streams[1]
    sent: list[tuple[float, bool]] = []  # (enqueued at, went to Redis)
    lowered_at = 0.0
    for turn in range(16):
        if turn == 6:
            client.set(ragflow_mq.Keys(unique).share, "0")  # what `gate --apply` writes
            lowered_at = time.monotonic()
        before = client.xlen(low)
        assert conn.queue_product(low, _memory_task("mem-hot"))
        sent.append((time.monotonic(), client.xlen(low) > before))
        await asyncio.sleep(0.5)
    client.close()
    assert not any(on_redis for _, on_redis in sent[:6]), (
        "served before the roll-back: not on Kafka"
    )
    # The refresh's period, one read's latency and a busy machine's scheduling.
    bound_s = refresh_s + 1.0
    late = [
        at - lowered_at for at, on_redis in sent[6:] if not on_redis and at - lowered_at > bound_s
    ]
    assert not late, f"still on Kafka {late} s after the live share went to 0"
    assert sum(on_redis for _, on_redis in sent) >= 6


def test_canvas_runs_and_dataset_jobs_each_take_their_own_place_in_the_share() -> None:
    """Every canvas debug run carries doc_id ``dataflow_x`` and every dataset-wide job
    ``graph_raptor_x``: keyed by those, each kind would be wholly in or out of the share."""
    settings = Settings.from_env({"MQ_BACKEND": "split", "KAFKA_SERVE_PERCENT": "25"})
    producer = ServeProducer(
        settings, BackgroundLoop(), RouteTable(settings.mirror.routes), lambda: 25.0,
        Recorder(), store=lambda: None, keys=ragflow_mq.Keys("unused"), spread=Spread(settings),
    )  # fmt: skip
    for fake_doc, task_type in (("dataflow_x", "dataflow"), ("graph_raptor_x", "raptor")):
        runs = [
            {"id": uuid.uuid1().hex, "doc_id": fake_doc, "task_type": task_type,
             "kb_id": "kb1", "tenant_id": "t1", "dataflow_id": "flow1", "file": None}
            for _ in range(2000)
        ]  # fmt: skip
        served = sum(producer.route("te.0.common", run) is not None for run in runs)
        assert 20.0 <= served / 20 <= 30.0, f"{fake_doc}: {served / 20:.1f} % served at 25 %"


async def test_with_a_state_store_apart_the_served_keys_live_there(
    stack: LocalStack,
    unique: str,
    tmp_path: Path,
    redis_conn: ModuleType,
    state_valkey: LocalValkey,
) -> None:
    """With SIDECAR_STATE_URL set, the live share, the evidence, the claims and the done markers are
    in the state store, none in RAGFlow's Valkey (an LRU cache that evicts keys with a TTL)."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    settings = Settings.from_env({**world.env, "SIDECAR_STATE_URL": state_valkey.url})
    assert ragflow_mq.install(settings)
    conn = redis_conn.REDIS_CONN
    runtime = conn._ragflow_mq_runtime
    keys = ragflow_mq.Keys(unique)
    state = valkey.Valkey(**settings.state.client_kwargs())
    ragflow = valkey.Valkey.from_url(stack.valkey.url)
    state.set(keys.share, "0")
    runtime.read_share()
    assert runtime.percent() == 0
    state.set(keys.share, "100")
    runtime.read_share()
    task = _tasks(f"{unique}doc", 1)[0]
    assert conn.queue_product(world.streams[1], task)
    taken: list[Any] = []

    def handed_out() -> bool:
        message = conn.queue_consumer(world.streams[1], GROUP, "task_executor_common_s_0")
        if message is not None:
            taken.append(message)
        return bool(taken)

    await wait_until(handed_out, 60, what="the served task handed out")
    assert taken[0].get_message()["id"] == task["id"]
    assert state.get(keys.claim(task["id"])) is not None
    taken[0].ack()
    await wait_until(lambda: state.exists(keys.done(task["id"])) == 1, 10, what="done marker")
    assert state.exists(keys.claim(task["id"])) == 0
    runtime.flush_evidence()
    assert int(state.hget(keys.evidence_total, "kafka:finished") or 0) == 1
    assert ragflow.keys(f"{unique}:*") == [], "a served key in RAGFlow's Valkey"
    state.close()
    ragflow.close()


async def test_the_evidence_counts_each_document_once_a_path(
    stack: LocalStack, unique: str, tmp_path: Path, redis_conn: ModuleType
) -> None:
    """The gate's failure and latency tests take documents as units: a document's first
    started, finished and failed task on a path, whatever the flushes and however many of its
    tasks fail."""
    world = await make_world(stack, unique, tmp_path, KAFKA_SERVE_PERCENT="100")
    assert ragflow_mq.install(Settings.from_env(world.env))
    conn, low = redis_conn.REDIS_CONN, world.streams[1]
    runtime = conn._ragflow_mq_runtime
    keys = ragflow_mq.Keys(unique)
    client = valkey.Valkey.from_url(stack.valkey.url)
    consumer = "task_executor_common_d_0"

    def run(tasks: list[dict[str, Any]], failing: set[str]) -> None:
        for task in tasks:
            assert conn.queue_product(low, task)
        done = 0
        deadline = time.monotonic() + 60
        while done < len(tasks) and time.monotonic() < deadline:
            list(conn.get_unacked_iterator(list(world.streams), GROUP, consumer))
            message = conn.queue_consumer(low, GROUP, consumer)
            if message is None:
                continue
            if message.get_message()["id"] in failing:
                runtime.failed(message.get_message()["id"])  # RAGFlow's set_progress(-1)
            assert message.ack()
            done += 1
        assert done == len(tasks)
        runtime.flush_evidence()

    def total(field: str) -> int:
        return int(client.hget(keys.evidence_total, field) or 0)

    client.set(keys.share, "0")
    runtime.read_share()
    first, second = _tasks(f"{unique}a", 3), _tasks(f"{unique}b", 2)
    run(first[:2] + second, failing={first[0]["id"], first[1]["id"]})
    run(first[2:], failing={first[2]["id"]})  # a later flush: the same document, not anew
    assert (total("redis:finished"), total("redis:failed")) == (5, 3)
    assert (total("redis:document_finished"), total("redis:document_failed")) == (2, 1)
    assert total("redis:document_started") == 2
    samples = sum(
        int(n) for name, n in client.hgetall(keys.evidence_total).items()
        if name.startswith(b"redis:document_processing:v2b")
    )  # fmt: skip
    assert samples == 2
    # Served from Kafka, a document counts there, once.
    client.set(keys.share, "100")
    runtime.read_share()
    run(_tasks(f"{unique}c", 3), failing=set())
    assert (total("kafka:finished"), total("kafka:document_finished")) == (3, 1)
    assert total("kafka:document_started") == 1 and total("redis:document_finished") == 2
    client.close()
