"""What ``ragflow_mq.install()`` costs a RAGFlow process: start-up, memory, threads, CPU (issue 25).

RAGFlow stand-in processes (tests/ragflow_standin) on a local Valkey and Kafka of the bench's
own, side by side: **without** ``install()`` (no sitecustomize, RAGFlow as it is) and
**installed** (``ragflow_mq/sitecustomize`` first on PYTHONPATH, MQ_BACKEND=split,
KAFKA_SERVE_PERCENT=100: every task through Kafka).

- start-up: wall time of ``python -c "import rag.utils.redis_conn"`` (sitecustomize, the
  import of ragflow_mq and the patch of REDIS_CONN included), and its CPU time, medians of
  --starts runs each, the kinds taking turns: the difference is what install() adds to every
  process's start (``-X importtime`` would
  charge ragflow_mq with valkey, which RAGFlow imports anyway); and of a process with the
  sitecustomize directory but the default backend, as every process of the image starts;
- idle: one executor of each (RAGFlow's 5 s sleep after an empty ``collect()``, 5 task slots),
  the installed one in its Kafka group, measured over --idle-s: CPU (% of one core), RSS and
  threads at the end;
- at 100 % served: a stand-in API process of each queues --tasks tasks at --rate a second to
  its own executor (fresh streams, topics and group); from the first task to the last
  execution: CPU per task of the executor and of the API process, their peak RSS and threads.

No target: exit 0, or 1 when a task was not executed. Usage:
    .venv/bin/python bench/ragflow_mq_footprint.py [--idle-s 30] [--tasks 2000] [--rate 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import valkey
from aiokafka.admin import AIOKafkaAdminClient
from bench_common import bench_stack, loadavg, process_cpu_s, rss_kib
from serve_throughput import create_topics

from sidecar.config.routing import DEFAULT_ROUTES, PRIORITY_PARSE
from sidecar.dev.local_stack import LocalStack

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "ragflow_standin"
SITECUSTOMIZE = REPO / "ragflow_mq" / "sitecustomize"
KINDS = ("without", "installed")
_INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def process_env(stack: LocalStack, unique: str, kind: str) -> dict[str, str]:
    """A stand-in process's whole environment, as tests/ragflow_support.standin_env makes it."""
    path = [str(STANDIN), str(REPO)]
    env = {name: os.environ[name] for name in _INHERITED if name in os.environ}
    high, low = f"{unique}.te.1.common", f"{unique}.te.0.common"
    env.update({
        "REDIS_URL": stack.valkey.url, "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers,
        "STANDIN_QUEUE_PREFIX": unique, "STANDIN_RESULTS_KEY": f"{unique}:executed",
        "STANDIN_IDLE_SLEEP_S": "5", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
    })  # fmt: skip
    if kind == "installed":
        path.insert(0, str(SITECUSTOMIZE))
        routes = {pattern: f"{unique}.tasks" for pattern in DEFAULT_ROUTES}
        routes[PRIORITY_PARSE] = f"{unique}.tasks.priority"
        env.update({
            "MQ_BACKEND": "split", "KAFKA_TRAFFIC_PERCENT": "100", "KAFKA_SERVE_PERCENT": "100",
            "MIRROR_STREAMS": f"{high},{low}", "MIRROR_PRIORITY_STREAMS": high,
            "MIRROR_ROUTES": json.dumps(routes), "KAFKA_CONSUMER_GROUP": f"{unique}-executors",
            "SERVE_KEY_PREFIX": unique,
        })  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def startup_ms(envs: dict[str, dict[str, str]], starts: int) -> dict[str, tuple[float, float]]:
    """Median wall time and CPU time (user + system; what a loaded machine changes least), per
    environment, of a process that imports RAGFlow's redis_conn and exits; the environments
    take turns, so a busier moment of the machine hits all alike."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in envs}
    for _ in range(starts):
        for name, env in envs.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import rag.utils.redis_conn"], env=env,
                           check=True, capture_output=True, timeout=60)  # fmt: skip
            wall = time.perf_counter() - began
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            times[name].append((wall * 1000, cpu * 1000))
    return {
        name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for name, values in times.items()
    }


def threads(pid: int) -> int:
    match = re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(match.group(1)) if match else 0


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, stopped (SIGTERM, then SIGKILL) and reaped by its own pid."""
    with log.open("wb") as out:
        child = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(10)


async def stable_members(stack: LocalStack, group: str) -> int:
    """Members of ``group`` once it is stable; 0 before (or with no coordinator yet)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.kafka.bootstrap_servers)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    except Exception:  # no coordinator yet for a new group
        return 0
    finally:
        await admin.close()
    groups = [g for r in responses for g in r.to_object()["groups"] if g["state"] == "Stable"]
    return sum(len(g["members"]) for g in groups)


def wait_for(what: str, ready: object, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


class Sample:
    """Peak RSS and threads of some processes, sampled every --sample-s."""

    def __init__(self) -> None:
        self.rss_kib: dict[int, int] = {}
        self.threads: dict[int, int] = {}

    def take(self, *pids: int) -> None:
        for pid in pids:
            rss = rss_kib(pid)
            if rss is not None:
                self.rss_kib[pid] = max(self.rss_kib.get(pid, 0), rss[0])
                self.threads[pid] = max(self.threads.get(pid, 0), threads(pid))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=15, help="start-ups timed per kind")
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--tasks", type=int, default=2000, help="tasks queued per kind")
    parser.add_argument("--rate", type=float, default=100.0, help="tasks a second per kind")
    parser.add_argument("--timeout-s", type=float, default=180.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    stack = bench_stack(root)
    stack.up()
    try:
        print(f"load average {loadavg()}; Python {sys.version.split()[0]}", flush=True)
        run = uuid.uuid4().hex[:8]
        envs = {kind: process_env(stack, f"fp{run}{kind[0]}", kind) for kind in KINDS}
        unique = {kind: envs[kind]["STANDIN_QUEUE_PREFIX"] for kind in KINDS}
        asyncio.run(create_topics(stack, f"{unique['installed']}.tasks",
                                  f"{unique['installed']}.tasks.priority"))  # fmt: skip
        # The sitecustomize directory on PYTHONPATH with the default backend: as every Python
        # process of RAGFlow's container starts (workers, scripts) when nothing is served.
        default = {**envs["without"], "PYTHONPATH": f"{SITECUSTOMIZE}{os.pathsep}"
                   + envs["without"]["PYTHONPATH"]}  # fmt: skip
        start = startup_ms({**envs, "default": default}, args.starts)
        print(f"start-up (import rag.utils.redis_conn), median of {args.starts}, wall / CPU:")
        for kind, label in (("without", "without install()"), ("default", "sitecustomize, "
                            "MQ_BACKEND=redis"), ("installed", "installed, split")):  # fmt: skip
            wall, cpu = start[kind]
            print(f"  {label:33} {wall:5.0f} ms / {cpu:4.0f} ms  (+{wall - start['without'][0]:.0f}"
                  f" / +{cpu - start['without'][1]:.0f} ms)", flush=True)  # fmt: skip
        with (
            process([sys.executable, "-m", "rag.svr.task_executor"],
                    {**envs["without"], "STANDIN_CONSUMER": "task_executor_fp_w"},
                    root / "executor-without.log") as bare,
            process([sys.executable, "-m", "rag.svr.task_executor"],
                    {**envs["installed"], "STANDIN_CONSUMER": "task_executor_fp_i"},
                    root / "executor-installed.log") as installed,
        ):  # fmt: skip
            executors = {"without": bare, "installed": installed}
            group = envs["installed"]["KAFKA_CONSUMER_GROUP"]
            wait_for("the installed executor in its Kafka group",
                     lambda: asyncio.run(stable_members(stack, group)) >= 1)  # fmt: skip
            time.sleep(2.0)  # the join's own CPU is not idle time
            idle_from = {k: (process_cpu_s(p.pid), time.monotonic()) for k, p in executors.items()}
            time.sleep(args.idle_s)
            print(f"idle {args.idle_s:g} s (executors: RAGFlow's 5 s sleep, 5 slots):")
            for kind, child in executors.items():
                cpu0, t0 = idle_from[kind]
                cpu = (process_cpu_s(child.pid) - cpu0) / (time.monotonic() - t0) * 100
                rss = (rss_kib(child.pid) or (0, 0))[0] / 1024
                print(f"  {kind:9}  CPU {cpu:5.2f} % of a core  RSS {rss:6.1f} MiB  "
                      f"threads {threads(child.pid)}", flush=True)  # fmt: skip
            return loaded(args, stack, envs, executors, root)
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


def loaded(
    args: argparse.Namespace,
    stack: LocalStack,
    envs: dict[str, dict[str, str]],
    executors: dict[str, subprocess.Popen[bytes]],
    root: Path,
) -> int:
    """Both kinds at --rate at once: executor and API process, CPU per task, peaks."""
    docs = args.tasks // 2
    api_args = [sys.executable, "-m", "ragflow_api", "--docs", str(docs), "--tasks-per-doc", "2",
                "--rate", str(args.rate)]  # fmt: skip
    sample = Sample()
    cpu0 = {k: process_cpu_s(p.pid) for k, p in executors.items()}
    began = time.monotonic()
    apis: dict[str, subprocess.Popen[bytes]] = {}
    api_cpu: dict[str, float] = {}
    with (
        process([*api_args, "--out", str(root / "api-without.jsonl")], envs["without"],
                root / "api-without.log") as apis["without"],
        process([*api_args, "--out", str(root / "api-installed.jsonl")], envs["installed"],
                root / "api-installed.log") as apis["installed"],
        closing(valkey.Valkey.from_url(stack.valkey.url)) as client,
    ):  # fmt: skip
        done: dict[str, float] = {}
        deadline = began + args.timeout_s
        while len(done) < len(KINDS) and time.monotonic() < deadline:
            sample.take(*(p.pid for p in executors.values()), *(p.pid for p in apis.values()))
            for kind in KINDS:
                if apis[kind].poll() is None:
                    api_cpu[kind] = process_cpu_s(apis[kind].pid)
                executed = int(client.llen(envs[kind]["STANDIN_RESULTS_KEY"]))
                if kind not in done and executed >= docs * 2:
                    done[kind] = time.monotonic()
                    cpu0[kind] = process_cpu_s(executors[kind].pid) - cpu0[kind]
            time.sleep(0.25)
        for kind in KINDS:
            apis[kind].wait(args.timeout_s)
        records = client.lrange(envs["installed"]["STANDIN_RESULTS_KEY"], 0, -1)
        from_kafka = sum(":" in str(json.loads(r)["msg_id"]) for r in records)
    print(f"at 100 % served: {docs * 2:,} tasks at {args.rate:g}/s per kind, both at once:")
    missing = [k for k in KINDS if k not in done]
    for kind in KINDS:
        if kind in missing:
            print(f"  {kind:9}  NOT all tasks executed within {args.timeout_s:g} s")
            continue
        per_task = cpu0[kind] / (docs * 2) * 1e6
        executor, api = executors[kind].pid, apis[kind].pid
        print(f"  {kind:9}  executor CPU {per_task:6.0f} µs/task, peak RSS "
              f"{sample.rss_kib[executor] / 1024:6.1f} MiB, threads {sample.threads[executor]:2}; "
              f"API CPU {api_cpu.get(kind, 0) / (docs * 2) * 1e6:6.0f} µs/task, peak RSS "
              f"{sample.rss_kib.get(api, 0) / 1024:6.1f} MiB, threads "
              f"{sample.threads.get(api, 0):2}; {done[kind] - began:.1f} s",
              flush=True)  # fmt: skip
    print(f"installed: {from_kafka:,} of {len(records):,} executions came from Kafka; "
          f"load average {loadavg()}")  # fmt: skip
    return 1 if missing or from_kafka < docs * 2 else 0


if __name__ == "__main__":
    sys.exit(main())
