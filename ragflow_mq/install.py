"""``install()``: RAGFlow's ``REDIS_CONN`` queue methods, replaced in place by the split's.

Only four methods of the one object change (``queue_product``, ``queue_consumer``,
``get_unacked_iterator``, ``queue_info``), as instance attributes over RAGFlow's own; the
originals do the Redis half unchanged, so at a served share of 0 % RAGFlow's Redis traffic is
what it was. ``rag.svr.task_executor.set_progress`` is watched (not changed) to count failures
per path. With ``MQ_BACKEND=redis`` nothing at all is touched.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import wraps
from types import ModuleType
from typing import Any

from ragflow_mq.cap import effective_percent, parse_cap
from ragflow_mq.consumer import KafkaTask, ServeConsumer
from ragflow_mq.contract import Keys
from ragflow_mq.evidence import Recorder, write
from ragflow_mq.loop import BackgroundLoop
from ragflow_mq.producer import ServeProducer
from sidecar.routing import RouteTable
from sidecar.settings import Settings

logger = logging.getLogger(__name__)

TARGET_MODULE = "rag.utils.redis_conn"
EXECUTOR_MODULES = ("rag.svr.task_executor", "__main__")
PATCHED = ("queue_product", "queue_consumer", "get_unacked_iterator", "queue_info")
_RUNTIME_ATTR = "_ragflow_mq_runtime"
_ENTRY_ID = re.compile(r"^(\d+)-\d+$")
_CONSUMER_RETRY_S = 5.0
_CLOSE_TIMEOUT_S = 10.0


class RedisTask:
    """RAGFlow's own ``RedisMsg``, with its hand-out and ack timed for the evidence."""

    def __init__(self, runtime: Runtime, message: Any) -> None:
        self._runtime = runtime
        self._message = message
        self.handed_out_s = time.time()
        self._acked = False

    def get_message(self) -> Any:
        return self._message.get_message()

    def get_msg_id(self) -> Any:
        return self._message.get_msg_id()

    def ack(self) -> bool:
        ok = bool(self._message.ack())
        if not self._acked:
            self._acked = True
            self._runtime.finished("redis", self)
        return ok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


class Runtime:
    """Everything ``install()`` runs in one process: the loop, the producer, the consumer
    (started on the first consuming call, with RAGFlow's consumer name), the cap and the
    evidence. ``close()`` runs at exit."""

    def __init__(self, settings: Settings, conn: Any) -> None:
        self.settings = settings
        self.keys = Keys(settings.serve.key_prefix)
        self.loop = BackgroundLoop()
        self.recorder = Recorder()
        self.routes = RouteTable(settings.mirror.routes)
        self._conn = conn
        self.originals: dict[str, Callable[..., Any]] = {n: getattr(conn, n) for n in PATCHED}
        self.producer = ServeProducer(settings, self.loop, self.routes, self.percent, self.recorder)
        self.consumer: ServeConsumer | None = None
        self._lock = threading.Lock()
        self._background = False
        self._consumer_retry_at = 0.0
        self._cap: float | None = None
        self._cap_warned = False
        self._paths: dict[str, str] = {}  # task id -> path, while RAGFlow holds the task
        self._redis_busy: dict[str, bool] = {}
        self._redis_turn: dict[str, bool] = {}
        self._closed = False

    def redis(self) -> Any:
        """RAGFlow's own synchronous client, looked up each time (RAGFlow may reopen it)."""
        return self._conn.REDIS

    # -- the share ---------------------------------------------------------------------------

    def percent(self) -> float:
        self._ensure_background()
        return effective_percent(self.settings.serve.percent, self._cap)

    def _read_cap(self) -> None:
        try:
            raw = self.redis().get(self.keys.cap)
        except Exception as exc:
            if not self._cap_warned:
                self._cap_warned = True
                logger.warning(
                    "ragflow_mq cannot read the serve cap (keeping %s): %s", self._cap, exc
                )
            return
        self._cap_warned = False
        cap = parse_cap(raw)
        if raw is not None and cap is None:
            logger.warning("ragflow_mq: serve cap %r is not a number; serving the env share", raw)
        if cap != self._cap:
            logger.info("ragflow_mq: serve cap now %s", cap)
        self._cap = cap

    def _ensure_background(self) -> None:
        if self._background:
            return
        with self._lock:
            if self._background:
                return
            # Read once before the first decision: after a roll-back the cap may be 0.
            self._read_cap()
            self.loop.spawn(self._refresh_cap, "ragflow-mq-cap")
            self.loop.spawn(self._flush_evidence, "ragflow-mq-evidence")
            self._background = True

    async def _refresh_cap(self) -> None:
        while True:
            await asyncio.sleep(self.settings.serve.cap_refresh_s)
            await asyncio.to_thread(self._read_cap)

    async def _flush_evidence(self) -> None:
        while True:
            await asyncio.sleep(self.settings.serve.evidence_flush_s)
            await asyncio.to_thread(self.flush_evidence)

    def flush_evidence(self) -> None:
        pending = self.recorder.drain()
        if not pending:
            return
        try:
            pipe = self.redis().pipeline(transaction=False)
            write(pipe, self.keys, pending)
            pipe.execute()
        except Exception as exc:
            self.recorder.restore(pending)
            logger.warning("ragflow_mq could not write its evidence (kept for later): %s", exc)

    # -- consuming ---------------------------------------------------------------------------

    def ensure_consumer(self, consumer_name: str) -> ServeConsumer | None:
        """The Kafka side of this executor, started on first use; ``None`` while Kafka cannot
        be reached (Redis work goes on meanwhile; a start is tried again every 5 s)."""
        if self.consumer is not None or self._closed:
            return self.consumer
        with self._lock:
            if self.consumer is not None or time.monotonic() < self._consumer_retry_at:
                return self.consumer
            watch_failures(self)
            consumer = ServeConsumer(
                self.settings,
                self.routes,
                self.keys,
                self.redis,
                self.recorder,
                consumer_name,
                on_finished=self.forget,
            )
            try:
                self.loop.run(consumer.start(), self.settings.kafka.request_timeout_ms / 1000 + 10)
            except Exception as exc:
                self._consumer_retry_at = time.monotonic() + _CONSUMER_RETRY_S
                logger.warning(
                    "ragflow_mq: Kafka consumer not started, Redis only for now: %s", exc
                )
                try:
                    self.loop.run(consumer.stop(), 30)
                except Exception:
                    logger.debug("stopping a consumer that did not start", exc_info=True)
                return None
            self.loop.spawn(consumer.run_fetch, "ragflow-mq-fetch")
            self.loop.spawn(consumer.run_commits, "ragflow-mq-commit")
            self.consumer = consumer
        self._ensure_background()
        return consumer

    def handed_out(self, path: str, task: KafkaTask | RedisTask, task_id: Any) -> None:
        self._paths[str(task_id)] = path

    def finished(self, path: str, task: RedisTask) -> None:
        """A Redis task was acked (Kafka tasks are counted by their consumer)."""
        self.recorder.count(path, "finished")
        self.recorder.observe(path, "processing", (time.time() - task.handed_out_s) * 1000)
        message = task.get_message()
        if isinstance(message, dict):
            self._paths.pop(str(message.get("id")), None)

    def forget(self, task_id: str) -> None:
        self._paths.pop(task_id, None)

    def failed(self, task_id: Any) -> None:
        path = self._paths.get(str(task_id))
        if path is not None:
            self.recorder.count(path, "failed")

    def redis_task(self, message: Any, *, retried: bool) -> RedisTask | None:
        if message is None or isinstance(message, RedisTask):
            return message
        task = RedisTask(self, message)
        self.recorder.count("redis", "started")
        if retried:
            self.recorder.count("redis", "retried")
        match = _ENTRY_ID.match(str(task.get_msg_id()))
        if match:
            self.recorder.observe("redis", "queue_wait", time.time() * 1000 - int(match[1]))
        body = task.get_message()
        if isinstance(body, dict):
            self.handed_out("redis", task, body.get("id"))
        return task

    def kafka_first(self, queue: str) -> bool:
        """Whether to offer Kafka's task before asking Redis: always while Redis's last read
        of this queue found nothing, alternately while both have work (neither starves)."""
        if not self._redis_busy.get(queue, False):
            return True
        turn = not self._redis_turn.get(queue, False)
        self._redis_turn[queue] = turn
        return not turn

    def note_redis(self, queue: str, found: bool) -> None:
        self._redis_busy[queue] = found

    def close(self) -> None:
        """Commit what is finished, leave the group, flush the evidence, stop the loop."""
        if self._closed:
            return
        self._closed = True
        consumer = self.consumer

        async def stop_consumer() -> None:
            if consumer is not None:
                await consumer.stop()

        self.loop.close([stop_consumer, self.producer.close], _CLOSE_TIMEOUT_S)
        # From the calling thread: at interpreter exit the loop's thread pool is already shut.
        self.flush_evidence()


def _patched_methods(runtime: Runtime) -> dict[str, Callable[..., Any]]:
    original = runtime.originals

    def queue_product(queue: str, message: Any) -> bool:
        try:
            route = runtime.producer.route(queue, message)
        except Exception:
            # A task the route table cannot read goes where RAGFlow would have put it.
            logger.exception("ragflow_mq could not route a task for %s; using Redis", queue)
            route = None
        if route is None:
            ok = bool(original["queue_product"](queue, message))
            if ok:
                runtime.recorder.count("redis", "produced")
            return ok
        try:
            return runtime.producer.produce(queue, message, route)
        except Exception:
            logger.exception("ragflow_mq.queue_product %s failed", queue)
            return False

    def queue_consumer(
        queue_name: str, group_name: str, consumer_name: str, msg_id: Any = b">"
    ) -> Any:
        if msg_id not in (b">", ">"):
            # A replay of this consumer's own pending entries (get_unacked_iterator).
            message = original["queue_consumer"](queue_name, group_name, consumer_name, msg_id)
            return runtime.redis_task(message, retried=True)
        consumer = runtime.ensure_consumer(consumer_name)
        kafka_first = consumer is not None and runtime.kafka_first(queue_name)
        if kafka_first and consumer is not None:
            task = consumer.take(queue_name)
            if task is not None:
                runtime.handed_out("kafka", task, task.task_id)
                return task
        message = original["queue_consumer"](queue_name, group_name, consumer_name, msg_id)
        runtime.note_redis(queue_name, message is not None)
        if message is not None:
            return runtime.redis_task(message, retried=False)
        if not kafka_first and consumer is not None:
            task = consumer.take(queue_name)
            if task is not None:
                runtime.handed_out("kafka", task, task.task_id)
                return task
        return None

    def get_unacked_iterator(
        queue_names: list[str], group_name: str, consumer_name: str
    ) -> Iterator[Any]:
        # Kafka needs no replay of its own: records not committed are delivered again to the
        # group. Starting the consumer here joins the group as early as RAGFlow's first call.
        runtime.ensure_consumer(consumer_name)
        for message in original["get_unacked_iterator"](queue_names, group_name, consumer_name):
            yield runtime.redis_task(message, retried=True)

    def queue_info(queue: str, group_name: str) -> Any:
        info = original["queue_info"](queue, group_name)
        consumer = runtime.consumer
        in_hand = consumer.in_hand() if consumer is not None else 0
        if in_hand and isinstance(info, dict):
            info = {**info, "pending": int(info.get("pending") or 0) + in_hand}
        return info

    return {
        "queue_product": queue_product,
        "queue_consumer": queue_consumer,
        "get_unacked_iterator": get_unacked_iterator,
        "queue_info": queue_info,
    }


def watch_failures(runtime: Runtime) -> None:
    """Count ``set_progress(task_id, prog=-1)`` per path: RAGFlow acks failed tasks like
    finished ones, and marks the failure only there (the outcome lives in its database)."""
    for name in EXECUTOR_MODULES:
        module = sys.modules.get(name)
        original = getattr(module, "set_progress", None) if module is not None else None
        if not callable(original) or getattr(original, "_ragflow_mq_watched", False):
            continue
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            continue
        if "prog" not in signature.parameters:
            continue

        @wraps(original)
        def set_progress(
            *args: Any, _original: Any = original, _sig: Any = signature, **kwargs: Any
        ) -> Any:
            result = _original(*args, **kwargs)
            try:
                bound = _sig.bind(*args, **kwargs)
                prog = bound.arguments.get("prog")
                if isinstance(prog, int | float) and prog < 0:
                    runtime.failed(next(iter(bound.arguments.values()), None))
            except Exception:
                logger.debug("could not read a set_progress call", exc_info=True)
            return result

        set_progress._ragflow_mq_watched = True  # type: ignore[attr-defined]
        module.set_progress = set_progress  # type: ignore[union-attr]


def patch(module: ModuleType, settings: Settings) -> Runtime:
    """Replace the queue methods of ``module.REDIS_CONN`` in place; idempotent."""
    conn = module.REDIS_CONN
    runtime = getattr(conn, _RUNTIME_ATTR, None)
    if isinstance(runtime, Runtime):
        return runtime
    runtime = Runtime(settings, conn)
    for name, method in _patched_methods(runtime).items():
        setattr(conn, name, method)
    setattr(conn, _RUNTIME_ATTR, runtime)
    atexit.register(runtime.close)
    logger.info(
        "ragflow_mq installed: MQ_BACKEND=%s, serving %g %% from Kafka",
        settings.mq_backend,
        settings.serve.percent,
    )
    return runtime


def unpatch(module: ModuleType) -> None:
    """Put RAGFlow's own methods back and close the runtime (tests, and a clean exit)."""
    conn = module.REDIS_CONN
    runtime = getattr(conn, _RUNTIME_ATTR, None)
    if not isinstance(runtime, Runtime):
        return
    for name in PATCHED:
        conn.__dict__.pop(name, None)
    delattr(conn, _RUNTIME_ATTR)
    atexit.unregister(runtime.close)
    runtime.close()


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``rag.utils.redis_conn`` right after RAGFlow imports it (sitecustomize runs
    before any of RAGFlow's modules exist)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self._settings)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, settings: Settings) -> None:
        self._loader = loader
        self._settings = settings

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module, self._settings)


def install(settings: Settings | None = None) -> bool:
    """Route RAGFlow's task queue by ``MQ_BACKEND``: True when the split is (or will be, once
    RAGFlow imports ``rag.utils.redis_conn``) in place, False for ``redis`` (nothing done).

    Raises :class:`~sidecar.errors.ConfigError` naming the variable for a bad setting.
    """
    settings = settings or Settings.from_env()
    if settings.mq_backend == "redis":
        return False
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        patch(module, settings)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(settings))
    return True


def uninstall() -> None:
    """Undo ``install()`` in this process."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchOnImport)]
    module = sys.modules.get(TARGET_MODULE)
    if module is not None:
        unpatch(module)
