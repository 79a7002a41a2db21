"""The handler the shadow comparison runs on both copies of a task, and how it is run.

The runner calls one handler on the Redis copy (redis run) and on the Kafka copy (kafka run) and
compares the two :class:`HandlerResult` values. Handlers are side-effect free: anything they
need from the outside (the ``{task_id}-cancel`` key) is looked up by the runner beforehand and
passed in :class:`TaskMeta`.

Built-in handlers (``SHADOW_HANDLER``):

- ``ragflow`` (default): :func:`ragflow_dry_run`, what RAGFlow's task executor would decide
  for the message, without touching anything.
- ``noop``: a constant outcome, to measure the pipeline itself.
- ``package.module:callable``: any callable ``(task, meta)``, sync or async.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.errors import ConfigError
from sidecar.shadow.dry_run import ragflow_dry_run
from sidecar.shadow.meta import TaskMeta

__all__ = [
    "DEFAULT_HANDLER",
    "SETTING",
    "Handler",
    "HandlerResult",
    "NamedHandler",
    "TaskMeta",
    "load_handler",
    "noop",
    "ragflow_dry_run",
    "run_handler",
]

SETTING = "SHADOW_HANDLER"
DEFAULT_HANDLER = "ragflow"


Handler = Callable[[dict[str, Any], TaskMeta], Any]
"""``(task, meta) -> outcome``; may return an awaitable. Must not mutate ``task``."""


@dataclass(frozen=True, slots=True)
class NamedHandler:
    """A handler with the name it was configured by."""

    name: str
    func: Handler
    is_async: bool
    # Built-ins are known to take microseconds and are called on the event loop; custom sync
    # handlers are not trusted with it.
    builtin: bool = False


@dataclass(frozen=True, slots=True)
class HandlerResult:
    """One handler run: a JSON-safe outcome, or the error that stood in for it."""

    outcome: Any
    error: str | None
    elapsed_ms: float

    @property
    def ok(self) -> bool:
        return self.error is None


def noop(task: dict[str, Any], meta: TaskMeta) -> dict[str, Any]:
    """The same outcome for every task: the comparison then measures only the transport."""
    return {"ok": True}


def load_handler(spec: str = DEFAULT_HANDLER) -> NamedHandler:
    """The handler ``spec`` names: ``ragflow``, ``noop`` or ``package.module:callable``.

    A blank spec means the default. Raises :class:`ConfigError` for ``SHADOW_HANDLER``.
    """
    spec = spec.strip() or DEFAULT_HANDLER
    if spec == "ragflow":
        return NamedHandler("ragflow", ragflow_dry_run, is_async=False, builtin=True)
    if spec == "noop":
        return NamedHandler("noop", noop, is_async=False, builtin=True)
    if ":" not in spec:
        raise ConfigError(
            SETTING, f"{spec!r} is not 'ragflow', 'noop' or 'package.module:callable'"
        )
    module_name, _, attr_path = spec.partition(":")
    module_name, attr_path = module_name.strip(), attr_path.strip()
    if not module_name or not attr_path or ":" in attr_path:
        raise ConfigError(SETTING, f"{spec!r} is not of the form 'package.module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Tell a misspelt module apart from one that exists but imports something missing.
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise ConfigError(SETTING, f"module {module_name!r} not found") from exc
        raise ConfigError(SETTING, f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            SETTING, f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    target: object = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ConfigError(
                SETTING, f"module {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if not callable(target):
        raise ConfigError(
            SETTING, f"{spec!r} is not callable (it is of type {type(target).__name__})"
        )
    func: Handler = target
    return NamedHandler(spec, func, is_async=_is_coroutine_callable(func))


def _is_coroutine_callable(func: object) -> bool:
    # Instances with an ``async def __call__`` count too; partials are unwrapped by inspect.
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - looking at __call__ itself, on purpose
    )


async def run_handler(handler: NamedHandler, task: dict[str, Any], meta: TaskMeta) -> HandlerResult:
    """Run ``handler`` once; its exceptions and unserialisable outcomes become ``error``.

    Only :class:`asyncio.CancelledError` (and other non-``Exception`` exits) propagate.
    """
    started = time.perf_counter()
    try:
        if handler.builtin:
            value = handler.func(task, meta)
        else:
            # A private copy: a custom handler that mutates its task (from a worker thread,
            # even) must not change what the runner or the other path goes on to use.
            own = copy.deepcopy(task)
            if handler.is_async:
                value = handler.func(own, meta)
            else:
                value = await asyncio.to_thread(handler.func, own, meta)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        return HandlerResult(None, f"{type(exc).__name__}: {exc}", _ms_since(started))
    elapsed_ms = _ms_since(started)
    if handler.builtin:
        # ``noop`` and ``ragflow`` build their outcome of JSON types only (str keys, str, int,
        # bool, None, lists): the round trip below would give it back unchanged.
        return HandlerResult(value, None, elapsed_ms)
    try:
        # Round-tripped so both paths are compared as JSON (tuples become lists, int keys
        # strings), exactly as the outcome would be stored or sent.
        outcome = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        return HandlerResult(
            None, f"not JSON-serialisable: {type(exc).__name__}: {exc}", elapsed_ms
        )
    return HandlerResult(outcome, None, elapsed_ms)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
