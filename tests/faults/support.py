"""What every fault test shares: the sidecar as a real process, a RAGFlow-like producer and
worker, waiting on conditions, and the pass criteria checked with ``reconcile``."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import valkey.asyncio as avalkey
from valkey.exceptions import ConnectionError as ValkeyConnectionError
from valkey.exceptions import TimeoutError as ValkeyTimeoutError

from sidecar.cli.reconcile import StreamReconciliation, reconcile, render_report
from sidecar.config import Settings
from sidecar.dev.samples import ragflow_tasks
from sidecar.transport import KafkaConsumer
from sidecar.transport.topics import VERDICTS_TOPIC
from sidecar.verdicts.model import parse_verdict
from tests.mirror_support import RAGFLOW_GROUP, prepare_stream
from tests.shadow_support import read_verdicts

_OURS = ("KAFKA_", "MIRROR_", "REDIS_", "SHADOW_", "SIDECAR_", "OBSERVER_", "STATUS_")
WORKER = "task_executor_x_0"
# The mirror's batch in ``sidecar_env``: a crash can re-send at most this many records.
MIRROR_BATCH = 100


@dataclass
class FaultRow:
    """One line of the fault suite's table (printed at the end of the run)."""

    fault: str
    written: int
    missing: int
    duplicates: int  # Kafka records beyond the first per entry
    recover_s: float  # from the end of the fault until everything was in Kafka (and judged)
    note: str = ""

    @classmethod
    def of(
        cls, fault: str, row: StreamReconciliation, recover_s: float, note: str = ""
    ) -> FaultRow:
        """The line of a fault whose stream ``reconcile`` accounted for as ``row``."""
        return cls(fault, row.written, len(row.missing), row.extra_records, recover_s, note)


def valkey_url(settings: Settings) -> str:
    """The URL of the Valkey database ``settings`` name (no credentials in the tests)."""
    return f"redis://{settings.redis.host}:{settings.redis.port}/{settings.redis.db}"


def own_settings(
    base: Settings, stream: str, *, redis_url: str | None = None, bootstrap: str | None = None
) -> Settings:
    """Settings on ``stream`` and its shadow group, on ``base``'s Valkey and Kafka unless the test
    brings its own (``redis_url``, ``bootstrap``): where ``reconcile`` and the verdict reads look."""
    return Settings.from_env(
        {
            "REDIS_URL": redis_url or valkey_url(base),
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap or ",".join(base.kafka.bootstrap_servers),
            "MIRROR_STREAMS": stream,
            "SHADOW_GROUP": f"shadow-{stream}",
        }
    )


def sidecar_env(
    redis_url: str, bootstrap: str, stream: str, unique: str, **extra: str
) -> dict[str, str]:
    """The environment of a sidecar process on a test's own stream and groups."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(_OURS)},
        "REDIS_URL": redis_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA_REQUEST_TIMEOUT_MS": "5000",
        "MIRROR_STREAMS": stream,
        "MIRROR_START": "earliest",
        "MIRROR_GROUP": f"mirror-{unique}",
        "MIRROR_BATCH": str(MIRROR_BATCH),
        "MIRROR_BLOCK_MS": "200",
        "MIRROR_CLAIM_IDLE_MS": "2000",
        "SHADOW_GROUP": f"shadow-{unique}",
        # The task topics are shared by the whole test session: only what comes after us.
        "SHADOW_START": "latest",
        "SHADOW_COMPARE_TIMEOUT_S": "20",
        "OBSERVER_INTERVAL_MS": "200",
        "STATUS_INTERVAL_S": "5",
        "SIDECAR_METRICS_PORT": "0",
        # Stable names, as a deployment gives them: a restarted shadow rejoins its group as the
        # same static member, and the mirror replays its own pending entries first, in order.
        "SIDECAR_INSTANCE": f"sidecar-{unique}",
        "MIRROR_CONSUMER": f"mirror-{unique}",
        **extra,
    }


class SidecarProcess:
    """``ragflow-sidecar <command>`` as a child process, logging to ``log``; always reaped."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        self.command, self.env, self.log = command, env, log
        self.process: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sidecar", *self.command],
                env=self.env,
                stdout=out,
                stderr=out,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: no flush, no ack, no commit."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
            self.kills += 1

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait: the exit code of an orderly stop."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def __enter__(self) -> SidecarProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill it if it still runs (a test that failed half-way leaves nothing behind)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


async def wait_until(
    condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float, interval_s: float = 0.1
) -> float:
    """Poll ``condition`` until true; returns the seconds it took."""
    began = time.monotonic()
    while not await condition():
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(interval_s)
    return time.monotonic() - began


async def probe(port: int, path: str = "/readyz") -> int | None:
    """The HTTP status the sidecar's endpoint on ``port`` answers, ``None`` if it does not."""

    def get() -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    return await asyncio.to_thread(get)


async def answers(port: int, path: str, status: int) -> bool:
    """Whether the sidecar's endpoint ``path`` on ``port`` answers ``status``."""
    return await probe(port, path) == status


async def ready(port: int) -> bool:
    """Whether the sidecar's /readyz on ``port`` answers 200 (every loop running)."""
    return await answers(port, "/readyz", 200)


async def produce(
    client: avalkey.Valkey, stream: str, total: int, *, chunk: int = 100, pause_s: float = 0.1
) -> list[str]:
    """XADD ``total`` RAGFlow-shaped tasks in pipelined chunks; returns their entry ids."""
    ids: list[str] = []
    tasks = ragflow_tasks(total)
    for start in range(0, total, chunk):
        pipe = client.pipeline(transaction=False)
        for task in tasks[start : start + chunk]:
            pipe.xadd(stream, {"message": json.dumps(task)})
        ids += [entry_id.decode() for entry_id in await pipe.execute()]
        await asyncio.sleep(pause_s)
    return ids


async def ragflow_worker(
    client: avalkey.Valkey, stream: str, total: int, timeout_s: float = 300
) -> Counter[str]:
    """Consume like RAGFlow's task executor (XREADGROUP COUNT 1 in RAGFlow's group, then XACK),
    riding out a Valkey restart; returns how often each entry was handed to it.

    After a lost connection it first reads its own pending entries (id ``0``), as a restarted
    executor would: a reply lost with the connection leaves its entry pending on this consumer.
    """
    handled: Counter[str] = Counter()
    deadline = time.monotonic() + timeout_s
    reconnected = False
    while len(handled) < total and time.monotonic() < deadline:
        try:
            start = "0" if reconnected else ">"
            reply = await client.xreadgroup(
                RAGFLOW_GROUP, WORKER, {stream: start}, count=100 if reconnected else 1, block=50
            )
            for _, entries in reply or []:
                for entry_id, _fields in entries:
                    if not (reconnected and entry_id.decode() in handled):
                        handled[entry_id.decode()] += 1
                    await client.xack(stream, RAGFLOW_GROUP, entry_id)
            reconnected = False
        except (ValkeyConnectionError, ValkeyTimeoutError):
            # Valkey restarting, or too busy to accept a connection: RAGFlow's executor
            # retries too.
            reconnected = True
            await asyncio.sleep(0.2)
    return handled


async def assert_ragflow_untouched(
    client: avalkey.Valkey, stream: str, handled: Counter[str], ids: list[str]
) -> None:
    """RAGFlow's worker got every entry exactly once, and its group holds only its consumer
    with nothing pending: the sidecar never read in, claimed from or acked in RAGFlow's group."""
    assert set(handled) == set(ids), f"RAGFlow's worker missed {len(set(ids) - set(handled))}"
    assert max(handled.values()) == 1
    consumers = [c["name"].decode() for c in await client.xinfo_consumers(stream, RAGFLOW_GROUP)]
    assert consumers == [WORKER]
    assert (await client.xpending(stream, RAGFLOW_GROUP))["pending"] == 0


async def assert_reconciled(
    settings: Settings, stream: str, written: int, *, crashes: int, batch: int
) -> StreamReconciliation:
    """``reconcile`` says nothing is missing; duplicates at most one batch per crash."""
    report = await reconcile(settings, streams=[stream])
    row = report.streams[stream]
    print("\n" + render_report(report))
    assert row.written == written
    assert report.ok, f"missing {row.missing[:20]}"
    assert row.extra_records <= crashes * batch, f"{row.extra_records} duplicates"
    if crashes == 0:
        assert row.duplicated == {}
    return row


async def judged(
    settings: Settings, stream: str, total: int, timeout_s: float
) -> list[dict[str, Any]]:
    """Every verdict about ``stream``, once each of its ``total`` entries has a final one.

    One consumer reads the verdicts as they come. Each poll used to read the whole topic
    again in a group of its own within 10 s: with some 20,000 verdicts on a busy machine no
    read finished in time, and the wait failed however long the judge had been done."""
    found: list[dict[str, Any]] = []
    finals: set[str] = set()
    group = f"verdicts-{uuid.uuid4().hex[:8]}"
    async with KafkaConsumer(settings.kafka, [VERDICTS_TOPIC], group) as consumer:

        async def read() -> int:
            batch = await consumer.poll_batch(5000, 300)
            for message in batch:
                record = parse_verdict(message.value or b"")
                if record["stream"] == stream:
                    found.append(record)
                    if record["verdict"] != "duplicate":
                        finals.add(record["entry_id"])
            return len(batch)

        async def every_entry() -> bool:
            await read()
            return len(finals) >= total

        await wait_until(every_entry, f"a verdict for each of {total} entries", timeout_s, 0)
        # Read on briefly, as read_verdicts does: a verdict published twice must show.
        quiet = 0
        while quiet < 3:
            quiet = 0 if await read() else quiet + 1
    return found


def assert_one_verdict_each(verdicts: list[dict[str, Any]], ids: list[str]) -> Counter[str]:
    """Each entry has exactly one final verdict (none lost, none repeated), and all match."""
    finals = [v for v in verdicts if v["verdict"] != "duplicate"]
    per_entry = Counter(v["entry_id"] for v in finals)
    assert set(per_entry) == set(ids), f"{len(set(ids) - set(per_entry))} entries without verdict"
    repeated = {entry: n for entry, n in per_entry.items() if n > 1}
    assert not repeated, f"verdicts repeated for {list(repeated)[:10]}"
    odd = [(v["verdict"], v["differences"]) for v in finals if v["verdict"] != "match"][:3]
    assert not odd, odd
    return Counter(v["verdict"] for v in verdicts)


_last_acked: dict[str, int] = {}


async def acked_more(client: avalkey.Valkey, stream: str, group: str) -> bool:
    """Whether the group has acked entries since the last call said so."""
    info = next((g for g in await client.xinfo_groups(stream) if g["name"].decode() == group), None)
    if info is None:
        return False
    acked = int(info.get("entries-read") or 0) - int(info["pending"])
    if acked > _last_acked.get(stream, 0):
        _last_acked[stream] = acked
        return True
    return False


@dataclass
class Share:
    """A fault test's own stream with RAGFlow's group on it, on the Valkey and Kafka that
    ``settings`` name: the sidecar's environment for it, RAGFlow's producer and worker on it, and
    the checks at the end that nothing was lost and RAGFlow's side was left alone."""

    settings: Settings
    client: avalkey.Valkey
    stream: str

    @classmethod
    async def prepare(cls, settings: Settings, client: avalkey.Valkey, stream: str) -> Share:
        """The task topics made and RAGFlow's group created on ``stream``."""
        await prepare_stream(settings, client, stream)
        return cls(settings, client, stream)

    @property
    def mirror_group(self) -> str:
        """The mirror's group in ``env`` (named after the stream)."""
        return f"mirror-{self.stream}"

    def env(self, **extra: str) -> dict[str, str]:
        """A sidecar process's environment on this stream (see ``sidecar_env``)."""
        bootstrap = ",".join(self.settings.kafka.bootstrap_servers)
        return sidecar_env(valkey_url(self.settings), bootstrap, self.stream, self.stream, **extra)

    def worker(self, total: int, timeout_s: float = 300) -> asyncio.Task[Counter[str]]:
        """RAGFlow's worker on the stream, in the background (see ``ragflow_worker``)."""
        return asyncio.create_task(ragflow_worker(self.client, self.stream, total, timeout_s))

    def producer(
        self, total: int, *, chunk: int = 100, pause_s: float = 0.1
    ) -> asyncio.Task[list[str]]:
        """RAGFlow's producer on the stream, in the background (see ``produce``)."""
        return asyncio.create_task(
            produce(self.client, self.stream, total, chunk=chunk, pause_s=pause_s)
        )

    async def has_verdicts(self) -> bool:
        """Whether any verdict about the stream has been published yet."""
        return bool(await read_verdicts(self.settings, {self.stream}, expected=1, timeout_s=2))

    async def judged(self, total: int, timeout_s: float) -> list[dict[str, Any]]:
        """Every verdict about the stream, once each of ``total`` entries has a final one."""
        return await judged(self.settings, self.stream, total, timeout_s)

    async def assert_intact(
        self,
        total: int,
        ids: list[str],
        worker: Awaitable[Counter[str]],
        *,
        crashes: int,
        batch: int = MIRROR_BATCH,
    ) -> StreamReconciliation:
        """``assert_reconciled`` on the stream, then ``assert_ragflow_untouched`` with what the
        ``worker`` was handed; ``batch`` is the sidecar's MIRROR_BATCH."""
        row = await assert_reconciled(
            self.settings, self.stream, total, crashes=crashes, batch=batch
        )
        await assert_ragflow_untouched(self.client, self.stream, await worker, ids)
        return row


async def kill_repeatedly(
    process: SidecarProcess, share: Share, kills: int, rng: random.Random, max_pause_s: float
) -> None:
    """SIGKILL and restart ``process`` ``kills`` times, each at a random moment once its mirror
    acks entries again, so that each kill hits work (mid-batch, with nothing committed)."""
    for _ in range(kills):
        await wait_until(
            lambda: acked_more(share.client, share.stream, share.mirror_group),
            "the mirror to ack entries again",
            timeout_s=120,
            interval_s=0.05,
        )
        await asyncio.sleep(rng.uniform(0.0, max_pause_s))
        process.restart()
