"""``install()``: RAGFlow's ``REDIS_CONN`` queue methods, replaced in place by the split's.

Only four methods of the one object change (``queue_product``, ``queue_consumer``,
``get_unacked_iterator``, ``queue_info``), as instance attributes over RAGFlow's own; the
originals do the Redis half unchanged, so at a served share of 0 % RAGFlow's Redis traffic is
what it was. ``rag.svr.task_executor.set_progress`` is watched (not changed) to count failures
per path. With ``MQ_BACKEND=redis`` nothing at all is touched.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from ragflow_mq.runtime import PATCHED, Runtime
from sidecar.config import Settings

logger = logging.getLogger(__name__)

TARGET_MODULE = "rag.utils.redis_conn"
_RUNTIME_ATTR = "_ragflow_mq_runtime"


def _patched_methods(runtime: Runtime) -> dict[str, Callable[..., Any]]:
    original = runtime.originals

    def queue_product(queue: str, message: Any) -> bool:
        try:
            route = runtime.producer.route(queue, message)
        except Exception:
            # A task the route table cannot read goes where RAGFlow would have put it.
            logger.exception("ragflow_mq could not route a task for %s; using Redis", queue)
            route = None
        if route is not None:
            try:
                if runtime.producer.produce(queue, message, route):
                    return True
                may_divert = runtime.producer.divert(message)
            except Exception:
                logger.exception("ragflow_mq.queue_product %s failed", queue)
                return False
            if may_divert is None:
                return False
            if not may_divert:
                # The try that overran had landed, and an executor has the task already.
                runtime.recorder.count("kafka", "produced")
                return True
            runtime.recorder.count("kafka", "diverted")
        ok = bool(original["queue_product"](queue, message))
        if ok:
            runtime.recorder.count("redis", "produced")
        return ok

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
                runtime.handed_out("kafka", task, retried=task.retaken)
                return task
        message = original["queue_consumer"](queue_name, group_name, consumer_name, msg_id)
        runtime.note_redis(queue_name, message is not None)
        if message is not None:
            return runtime.redis_task(message, retried=False)
        if not kafka_first and consumer is not None:
            task = consumer.take(queue_name)
            if task is not None:
                runtime.handed_out("kafka", task, retried=task.retaken)
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
        backlog = runtime.served_backlog(queue)
        if not (in_hand or backlog) or not isinstance(info, dict | None):
            return info
        # RAGFlow reads "lag" as the tasks ahead of a document: a served document's are in
        # Kafka. No group on the stream (every task served) is still a queue with work.
        info = dict(info) if info is not None else {"name": group_name, "consumers": 0,
                                                    "pending": 0, "lag": 0}  # fmt: skip
        info["lag"] = int(info.get("lag") or 0) + backlog
        info["pending"] = int(info.get("pending") or 0) + in_hand
        return info

    return {
        "queue_product": queue_product,
        "queue_consumer": queue_consumer,
        "get_unacked_iterator": get_unacked_iterator,
        "queue_info": queue_info,
    }


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
    if settings.serve.percent > 0:
        # Kafka's producer starts now, in the background, not on the first task's clock.
        runtime.loop.spawn(runtime.producer.warm, "ragflow-mq-warm")
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
