"""Harness for integration tests with the RAGFlow stand-in (``tests/ragflow_standin``).

The stand-in runs as real processes: ``python -m rag.svr.task_executor`` (the executor) and
``python -m ragflow_api`` (the producer), with ``standin_env()`` as their whole environment.
With ``install=True`` the directory ``ragflow_mq/sitecustomize`` comes first on PYTHONPATH, so
Python loads its ``sitecustomize.py`` at start-up and ``ragflow_mq.install()`` patches the
stand-in's ``REDIS_CONN`` exactly as it would RAGFlow's.

The executor records one JSON line per execution (``task_id``, ``doc_id``, ``from_page``,
``priority``, ``consumer``, ``pid``, ``msg_id``, ``t`` = time.monotonic() at the start, the
same clock in every process of the machine) in the list ``results_key``, and its
``set_progress`` calls in ``<results_key>:progress``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import valkey.asyncio as avalkey

from sidecar.dev.local_stack import LocalStack

__all__ = [
    "SITECUSTOMIZE_DIR",
    "STANDIN_ROOT",
    "StandinProcess",
    "assert_doc_order",
    "assert_exactly_once",
    "executions",
    "pending_count",
    "progress",
    "read_produced",
    "standin_env",
    "wait_until",
]

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
STANDIN_ROOT = TESTS / "ragflow_standin"
SITECUSTOMIZE_DIR = REPO / "ragflow_mq" / "sitecustomize"
# Inherited from the parent so the child finds its tools and a temp directory; nothing else is.
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SIDECAR_CACHE_DIR")


def standin_env(
    stack_or_urls: LocalStack | Mapping[str, str],
    *,
    prefix: str,
    results_key: str,
    install: bool = False,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A clean environment for a stand-in process.

    ``stack_or_urls`` is the session's ``LocalStack`` or a mapping with ``REDIS_URL`` and
    ``KAFKA_BOOTSTRAP_SERVERS``. ``prefix`` becomes ``STANDIN_QUEUE_PREFIX`` (streams
    ``<prefix>.te.1.common`` and ``<prefix>.te.0.common``), ``results_key`` the
    ``STANDIN_RESULTS_KEY``. ``extra`` (e.g. ``MQ_BACKEND``, ``STANDIN_CONSUMER``) wins over all.
    """
    if isinstance(stack_or_urls, Mapping):
        redis_url = stack_or_urls["REDIS_URL"]
        bootstrap = stack_or_urls.get("KAFKA_BOOTSTRAP_SERVERS", "")
    else:
        redis_url = stack_or_urls.valkey.url
        bootstrap = stack_or_urls.kafka.bootstrap_servers
    # The checkout's own ragflow_mq and sidecar: the virtualenv's editable install may point
    # at another checkout, whose code the children would otherwise run instead of this one's.
    path = [str(STANDIN_ROOT), str(REPO)]
    if install:
        path.insert(0, str(SITECUSTOMIZE_DIR))
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "REDIS_URL": redis_url,
            "STANDIN_QUEUE_PREFIX": prefix,
            "STANDIN_RESULTS_KEY": results_key,
        }
    )
    if bootstrap:
        env["KAFKA_BOOTSTRAP_SERVERS"] = bootstrap
    env.update(extra or {})
    return env


class StandinProcess:
    """One stand-in process; output to ``log_path``; stopped and reaped by its own pid."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = args
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def executor(
        cls, env: Mapping[str, str], log_dir: Path, consumer: str, **extra: str
    ) -> StandinProcess:
        """An executor named ``consumer``; ``extra`` env such as ``MAX_CONCURRENT_TASKS="1"``."""
        child_env = {**env, "STANDIN_CONSUMER": consumer, **extra}
        log = log_dir / f"{consumer}.{time.monotonic_ns()}.log"
        return cls([sys.executable, "-m", "rag.svr.task_executor"], child_env, log)

    @classmethod
    def supervised_executor(
        cls, env: Mapping[str, str], log_dir: Path, consumer: str, **extra: str
    ) -> StandinProcess:
        """An executor under the entrypoint's restart loop: killed, it is back in about a
        second under the same name (``kill_executor()`` kills the running one)."""
        child_env = {**env, "STANDIN_CONSUMER": consumer, **extra}
        log = log_dir / f"{consumer}.{time.monotonic_ns()}.log"
        return cls([sys.executable, "-m", "entrypoint"], child_env, log)

    def executor_pid(self) -> int | None:
        """The running executor under a supervised process (None between two runs)."""
        path = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        try:
            children = path.read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    async def kill_executor(self, timeout_s: float = 30.0) -> int:
        """SIGKILL the supervised executor (mid-task); returns its pid."""
        pids: list[int] = []

        def running() -> bool:
            pid = self.executor_pid()
            pids[:] = [pid] if pid else []
            return bool(pid)

        await wait_until(running, timeout_s, what="a running executor")
        os.kill(pids[0], signal.SIGKILL)
        return pids[0]

    @classmethod
    def api(
        cls,
        env: Mapping[str, str],
        log_dir: Path,
        out: Path,
        *,
        docs: int,
        tasks_per_doc: int,
        priority_every: int = 0,
        rate: float = 0.0,
    ) -> StandinProcess:
        args = [
            sys.executable, "-m", "ragflow_api",
            "--docs", str(docs), "--tasks-per-doc", str(tasks_per_doc),
            "--priority-every", str(priority_every), "--rate", str(rate), "--out", str(out),
        ]  # fmt: skip
        return cls(args, env, log_dir / f"api.{time.monotonic_ns()}.log")

    def start(self) -> Self:
        if self.process is not None:
            raise RuntimeError("already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                cwd=self.log_path.parent,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def _proc(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise RuntimeError("not started")
        return self.process

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float = 60.0) -> int:
        """Exit code, once the process has ended (reaped); TimeoutExpired past ``timeout``."""
        return self._proc.wait(timeout)

    async def await_exit(self, timeout_s: float = 60.0) -> int:
        """``wait`` without blocking the event loop."""
        return await asyncio.to_thread(self.wait, timeout_s)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait for the exit code (a two-phase stop: the work in hand finishes)."""
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        """SIGKILL and reap; under the restart loop, its running executor too (the loop first,
        so that it starts no other): killed alone, the loop left it running, orphaned."""
        if self._proc.poll() is None:
            child = self.executor_pid()
            os.kill(self._proc.pid, signal.SIGKILL)
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        return self.wait(30)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> Self:
        if self.process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


async def _lrange_json(client: avalkey.Valkey, key: str) -> list[dict[str, Any]]:
    raw: list[bytes] = await client.lrange(key, 0, -1)  # type: ignore[misc]
    return [json.loads(line) for line in raw]


async def executions(client: avalkey.Valkey, results_key: str) -> list[dict[str, Any]]:
    """Every execution the stand-in executors recorded, in the order they were recorded."""
    return await _lrange_json(client, results_key)


async def progress(client: avalkey.Valkey, results_key: str) -> list[dict[str, Any]]:
    """Every ``set_progress`` call (``task_id``, ``progress``, ``progress_msg``, ...)."""
    return await _lrange_json(client, f"{results_key}:progress")


def read_produced(out: Path) -> list[dict[str, Any]]:
    """The lines ``ragflow_api --out`` wrote (``task_id``, ``doc_id``, ``from_page``, ...)."""
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


async def pending_count(client: avalkey.Valkey, streams: Iterable[str], group: str) -> int:
    """Entries delivered to ``group`` and not acked, over ``streams`` (missing ones count 0)."""
    total = 0
    for stream in streams:
        if not await client.exists(stream):
            continue
        groups = await client.xinfo_groups(stream)
        if not any(g["name"] in (group, group.encode()) for g in groups):
            continue
        summary = await client.xpending(stream, group)
        total += int(summary["pending"])
    return total


def _summary(ids: Iterable[str], limit: int = 5) -> str:
    items = sorted(ids)
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def assert_exactly_once(produced_ids: Iterable[str], records: Iterable[Mapping[str, Any]]) -> None:
    """Each produced task executed exactly once, and nothing else executed."""
    produced = set(produced_ids)
    counts = Counter(str(r["task_id"]) for r in records)
    missing = produced - counts.keys()
    doubled = {task_id for task_id, n in counts.items() if n > 1}
    unexpected = counts.keys() - produced
    problems = []
    if missing:
        problems.append(f"{len(missing)} never executed: {_summary(missing)}")
    if doubled:
        problems.append(f"{len(doubled)} executed more than once: {_summary(doubled)}")
    if unexpected:
        problems.append(f"{len(unexpected)} executed but never produced: {_summary(unexpected)}")
    assert not problems, f"of {len(produced)} tasks: " + "; ".join(problems)


def assert_doc_order(records: Iterable[Mapping[str, Any]]) -> None:
    """Per document, the first execution of each task started in increasing ``from_page`` order.

    Start order equals hand-out order only when tasks are taken one at a time: one executor
    with ``MAX_CONCURRENT_TASKS=1``. RAGFlow promises no order across its concurrent slots or
    executors (each slot reads the next entry as soon as it is free, and a slow page range may
    start after a later one), so do not use this check with several slots or executors.
    Replays (a second execution of a task) are ignored.
    """
    first: dict[str, Mapping[str, Any]] = {}
    for record in sorted(records, key=lambda r: float(r["t"])):
        first.setdefault(str(record["task_id"]), record)
    pages: dict[str, list[int]] = defaultdict(list)
    for record in sorted(first.values(), key=lambda r: float(r["t"])):
        pages[str(record["doc_id"])].append(int(record["from_page"]))
    out_of_order = {doc: seen for doc, seen in pages.items() if seen != sorted(seen)}
    assert not out_of_order, f"pages started out of order: {dict(list(out_of_order.items())[:3])}"


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout_s: float,
    *,
    interval_s: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` (sync or async) until it holds; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)
