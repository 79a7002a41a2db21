"""Names shared by what RAGFlow loads (``ragflow_mq``) and the sidecar's commands that read
what it leaves behind (``gate``, ``drain-to-redis``, ``reconcile``, the shadow): record
headers and Valkey keys. Changing one is changing a wire format."""

from __future__ import annotations

from typing import Final, Literal

# On every record RAGFlow executes from Kafka ("served"): b"1". The mirror's copies of Redis
# entries never carry it, so an executor skips them and the shadow skips served records.
SERVED_HEADER: Final = "x-served"
# The stream RAGFlow named in queue_product(queue, ...): the executor hands the record out
# when RAGFlow asks that queue, and drain-to-redis puts it back there.
QUEUE_HEADER: Final = "x-ragflow-queue"
SERVED_SOURCE: Final = b"ragflow_mq"

Path = Literal["redis", "kafka"]
PATHS: Final[tuple[Path, ...]] = ("redis", "kafka")
# produced: queue_product succeeded; started: handed to RAGFlow by queue_consumer; finished:
# acked (success and failure alike, as RAGFlow acks both); failed: RAGFlow set progress -1;
# retried: handed out again (a pending replay, a dead executor's task taken over);
# dead_lettered: sent to the DLQ instead of RAGFlow (undecodable only); diverted: meant for
# Kafka, enqueued on Redis because Kafka was away or slow (the breaker); duplicate: a served
# record whose task had already run or gone to Redis, skipped; abandoned: handed out and
# never acked, RAGFlow gave up on it (a database error right after queue_consumer), left
# pending for its consumer name as Redis leaves the entry.
EVENTS: Final = (
    "produced", "started", "finished", "failed", "retried", "dead_lettered", "diverted",
    "duplicate", "abandoned",
)  # fmt: skip
# A document is what one routing key holds (a document's tasks, a memory's, one dataset-wide
# job or canvas run): its tasks all take one path and share its fate (a broken PDF fails every
# page range), so the gate's tests take documents, not tasks, as their independent units.
# document_<event>: a document's first task with that event on a path (within DOCUMENT_TTL_S).
DOCUMENT_EVENTS: Final = ("document_started", "document_finished", "document_failed")
Event = Literal[
    "produced", "started", "finished", "failed", "retried", "dead_lettered", "diverted",
    "duplicate", "abandoned", "document_started", "document_finished", "document_failed",
]  # fmt: skip
# queue_wait: enqueued to handed out; processing: handed out to acked. document_queue_wait:
# the queue wait of a document's first started task; document_processing: the processing time
# of its first finished task (one sample a document, as the events).
LATENCIES: Final = ("queue_wait", "processing")
Latency = Literal["queue_wait", "processing", "document_queue_wait", "document_processing"]
# Upper bounds (ms) of the latency histograms; the last bucket is open. Roughly 1.5x apart
# from 1 s to 3 h, RAGFlow's range, so that a 1.5x slowdown moves a task about one bucket
# wherever it falls; fields <path>:<latency>:v2b<index> (BUCKET_FIELD).
BUCKETS_MS: Final[tuple[float, ...]] = (
    10, 25, 50, 100, 250, 500, 1000, 1500, 2500, 3500, 5000, 7000, 10000, 15000, 20000, 30000,
    45000, 60000, 90000, 120000, 180000, 300000, 450000, 600000, 900000, 1200000, 1800000,
    2700000, 3600000, 5400000, 7200000, 10800000,
)  # fmt: skip
BUCKET_FIELD: Final = "v2b"
# The layout of builds before issue 23 (fields <path>:<latency>:b<index>), still read: a
# window may hold minutes, or processes, of both. Every one of its bounds from 10 ms up is
# also a bound of BUCKETS_MS, so both layouts merge exactly onto the bounds they share.
LEGACY_BUCKETS_MS: Final[tuple[float, ...]] = (
    5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 1800000,
)  # fmt: skip
LEGACY_BUCKET_FIELD: Final = "b"
EVIDENCE_TTL_S: Final = 2 * 86400
# How long a document's first events are remembered: RAGFlow enqueues a document's tasks
# together and they run within hours; a parse started again after this counts anew. About
# 150 bytes of the state store a document.
DOCUMENT_TTL_S: Final = 12 * 3600
# A document's outcome (document_finished, document_failed, document_processing) and its tasks'
# retries are filed under the minute the document started on its path, so that each minute
# pairs its documents with their own outcomes: a failure seen minutes later is not compared
# with the documents that started when it was seen. Only within this horizon: a document that
# started earlier has its outcome filed under the minute it is seen, since a reader (the
# autopilot's ledger) takes a minute as final once it is this much plus a flush behind.
ATTRIBUTION_MINUTES: Final = 60
DEFAULT_KEY_PREFIX: Final = "ragflow_mq"
# A task's done marker when Redis has it (diverted before it was enqueued there, or handed back
# by drain-to-redis): no Kafka record of it may run.
REDIS_MARKER: Final = "redis"


class Keys:
    """The Valkey keys under one prefix (``SERVE_KEY_PREFIX``; tests use their own)."""

    def __init__(self, prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self.prefix = prefix
        # Never given a TTL: RAGFlow's Valkey evicts volatile keys (volatile-lru) first, and a
        # live share that vanished would serve the ceiling in a process started after it.
        self.share = f"{prefix}:serve_share"
        # Every change of the live share: from, to, by whom (a capped stream, newest last).
        self.share_log = f"{prefix}:serve_share:log"
        # The cap of earlier builds, still honoured (the lower wins) until a shift folds it in.
        self.old_cap = f"{prefix}:serve_cap"
        self.evidence_total = f"{prefix}:evidence:total"
        # A minute's key less its minute: the recording script files an event under an older
        # minute by name (``evidence``).
        self.evidence_minute = f"{prefix}:evidence:"

    def evidence(self, minute: int) -> str:
        """Per-minute counts (``minute`` = epoch seconds // 60), kept two days."""
        return f"{self.evidence_minute}{minute}"

    def document(self, document: str) -> str:
        """Which of a document's first events were counted, per path (``kafka:finished``), and
        the minute it started on each path (``kafka:started``)."""
        return f"{self.prefix}:evidence:document:{document}"

    def claim(self, task_id: str) -> str:
        """Which executor process holds a served task (``<consumer>|<incarnation>``), from its
        hand-out until it is acked: the served path's pending-entries list."""
        return f"{self.prefix}:claim:{task_id}"

    def done(self, task_id: str) -> str:
        """Set when a served task was acked, or enqueued on Redis instead (``redis``): a
        record of that task id read later (a duplicate, a redelivery) is skipped."""
        return f"{self.prefix}:done:{task_id}"

    def alive(self, owner: str) -> str:
        """Refreshed by a live executor process; its claims lapse when it is gone."""
        return f"{self.prefix}:alive:{owner}"

    def incarnation(self, consumer_name: str) -> str:
        """The incarnation of the process that last started under a consumer name: its
        earlier incarnations are gone (RAGFlow restarts a dead executor under its old name)."""
        return f"{self.prefix}:incarnation:{consumer_name}"

    def pending(self, consumer_name: str) -> str:
        """A consumer name's served tasks handed out and never acked (task id -> record),
        taken back when it starts again (``ragflow_mq.pending``)."""
        return f"{self.prefix}:pending:{consumer_name}"

    @property
    def pending_index(self) -> str:
        """The consumer names with pending served tasks."""
        return f"{self.prefix}:pending"

    def drained(self, topic: str, partition: int, offset: int) -> str:
        """The stream entry id a served record was moved to by drain-to-redis."""
        return f"{self.prefix}:drained:{topic}:{partition}:{offset}"

    @property
    def drained_pattern(self) -> str:
        return f"{self.prefix}:drained:*"


def count_field(path: str, event: str) -> str:
    return f"{path}:{event}"


def bucket_field(path: str, latency: str, index: int) -> str:
    """The field of bucket ``index`` (``len(BUCKETS_MS)`` is the open one)."""
    return f"{path}:{latency}:{BUCKET_FIELD}{index}"


def sum_field(path: str, latency: str) -> str:
    return f"{path}:{latency}:sum_ms"
