"""Hostile input against real Valkey and Kafka: whatever is in a stream entry or a task record,
the sidecar does not crash, and each one ends exactly once in its task topic or in the DLQ.

The mirror side is a Hypothesis property over lists of arbitrary stream entries (missing and
extra fields, random bytes, invalid UTF-8, JSON past Python's parser limits, lone surrogates,
duplicate keys, 2 MB values). An oracle written here, independent of the mirror's code paths,
says where each entry must end; the entries are mirrored in-process and read back from Kafka up
to the end offsets, and reconcile's accounting must agree. The shadow side writes records
straight into the task topics (broken values; headers missing, not UTF-8, doubled, huge): the
shadow must commit past each, record its kafka run (so it gets a verdict), and dead-letter
exactly those whose value is no task. Deterministic regression tests pin each bug found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import valkey.asyncio as avalkey
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.app.service import Sidecar
from sidecar.app.wiring import running_mirror
from sidecar.cli.reconcile import reconcile
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.errors import MessageDecodeError
from sidecar.mirror.mirror import Mirror
from sidecar.mirror.records import MAX_REQUEST_BYTES
from sidecar.transport import KafkaConsumer
from sidecar.transport.dead_letter import dead_letter
from sidecar.transport.message import decode_task
from sidecar.transport.topics import (
    DLQ_TOPIC,
    PARSE_PRIORITY_TOPIC,
    PARSE_TOPIC,
    TOPIC_PLAN,
    VERDICTS_TOPIC,
    init_topics,
)
from sidecar.verdicts.join import EntryRef
from sidecar.verdicts.model import parse_verdict
from tests.mirror_support import Mirrored
from tests.shadow_support import sidecar_settings

MESSAGE = b"message"
HUGE = 2 * 1024 * 1024  # past the 1 MB Kafka request size
DEEP = 10_000  # nesting levels: far past json's recursion limit
OUT_TOPICS = sorted(topic for topic in TOPIC_PLAN if topic != VERDICTS_TOPIC)
EXAMPLES = 300
SHADOW_EXAMPLES = 30

Fields = tuple[tuple[bytes, bytes], ...]  # in XADD order; a name may repeat


def against_real_servers(examples: int) -> settings:
    """Hypothesis's settings for ``examples`` runs on the real servers: no deadline and no example
    database, and without the health checks that slow I/O and huge values would fail."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


# --- the oracle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """Where an entry must end: a task topic, or the DLQ with a reason."""

    topic: str
    reason: str | None = None


def _encodable(text: object) -> bool:
    return not isinstance(text, str) or not any("\ud800" <= c <= "\udfff" for c in text)


def expected_for(fields: Fields) -> Expected:
    """Where the mirror must put an entry, decided without the mirror's own decoder."""
    by_name = dict(fields)  # a repeated field: the last value wins, as every client reads it
    value = by_name.get(MESSAGE)
    if value is None:
        return Expected(DLQ_TOPIC, "no_message_field")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return Expected(DLQ_TOPIC, "not_utf8")
    try:
        task = json.loads(text)
    except (ValueError, RecursionError):  # bad JSON, or beyond Python's int or nesting limits
        return Expected(DLQ_TOPIC, "not_json")
    if not isinstance(task, dict):
        return Expected(DLQ_TOPIC, "not_object")
    task_id = task.get("id")
    if not isinstance(task_id, str) or not task_id:
        return Expected(DLQ_TOPIC, "no_task_id")
    route = RouteTable().route(task, 0)
    if not all(_encodable(s) for s in (task_id, route.key, route.task_type, task.get("tenant_id"))):
        return Expected(DLQ_TOPIC, "not_unicode")
    # Generated sizes stay far from the limit on either side, so this needs no precision.
    if len(value) + len(by_name.get(b"traceparent", b"")) + len(route.key) > MAX_REQUEST_BYTES:
        return Expected(DLQ_TOPIC, "too_large")
    return Expected(route.topic)


# --- strategies ------------------------------------------------------------------------------


def _obj(members: Sequence[str]) -> str:
    return "{" + ",".join(members) + "}"


def _nest(kind: str, inner: str, depth: int) -> str:
    if kind == "list":
        return "[" * depth + inner + "]" * depth
    return '{"a":' * depth + inner + "}" * depth


JSON_WORDS = ["null", "true", "false", "NaN", "Infinity", "-Infinity", "-0", "0", "1e999", "-1e-999"]  # fmt: skip
# Lone surrogates (escaped, as RAGFlow's ensure_ascii writes them), a valid pair, NUL.
ESCAPES = ['"\\ud800"', '"a\\udc00b"', '"\\udfff\\ud800"', '"\\ud83d\\ude00"', '"\\u0000"']
TASK_TYPES = ["raptor", "graphrag", "dataflow", "dataflow_rerun", "memory", "structure_x", "session_a", "wiki", "no_such_type"]  # fmt: skip
# Past Python's 4300-digit int-string limit: json.loads raises ValueError.
huge_int = st.integers(4_300, 6_000).map(lambda digits: "9" * digits)
scalars = st.one_of(
    st.sampled_from(JSON_WORDS),
    st.sampled_from(ESCAPES),
    st.integers().map(str),
    st.floats().map(json.dumps),
    st.text(max_size=8).map(json.dumps),
    st.text(max_size=8).map(lambda s: json.dumps(s, ensure_ascii=False)),
)
keys = st.one_of(
    st.sampled_from(['"id"', '"doc_id"', '"task_type"', '"a"', '"\\ud800"', '""']),
    st.text(max_size=8).map(json.dumps),
)
json_texts = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(keys, inner), max_size=4).map(
            lambda pairs: _obj([f"{k}:{v}" for k, v in pairs])
        ),
    ),
    max_leaves=4,
)
hex_ids = st.uuids().map(lambda u: json.dumps(u.hex))
# Values of the fields the mirror reads; None leaves the field out.
# Anything but a usable id: absent (None), not a string, empty, a lone surrogate, a huge int.
bad_ids = st.one_of(st.none(), scalars, st.sampled_from(["[]", "{}", '["x"]', '""']), huge_int)
type_values = st.one_of(
    st.none(),
    st.sampled_from(TASK_TYPES).map(json.dumps),
    st.sampled_from(TASK_TYPES).map(json.dumps),
    st.sampled_from(['"\\ud800"', '""', "7", "[]", "null"]),
    scalars,
)
doc_values = st.one_of(
    st.none(), hex_ids, st.sampled_from(['"graph_raptor_x"', '"dataflow_x"', '""', '"\\udc80"']),
    scalars,
)  # fmt: skip


@st.composite
def task_texts(draw: st.DrawFn) -> str:
    """A RAGFlow-like task object, with its fields missing, mistyped or doubled."""
    members = []
    mostly = st.sampled_from([True, True, True, True, False])
    for name, values in (
        ("id", hex_ids if draw(mostly) else bad_ids),
        ("doc_id", doc_values),
        ("task_type", type_values),
        ("tenant_id", doc_values),
        ("memory_id", doc_values),
    ):
        value = draw(values)
        if value is not None:
            members.append(f'"{name}":{value}')
    members += [f"{k}:{v}" for k, v in draw(st.lists(st.tuples(keys, json_texts), max_size=2))]
    draw(st.randoms(use_true_random=False)).shuffle(members)
    if not draw(mostly):
        members.append(f'"id":{draw(bad_ids) or draw(hex_ids)}')  # a duplicate key: the last wins
    return _obj(members)


@st.composite
def message_values(draw: st.DrawFn) -> bytes:
    """The bytes of a ``message`` field: mostly task-like, then broken in one way or another."""
    kind = draw(
        st.sampled_from(
            ["task", "task", "task", "task", "task", "task", "task", "task", "task", "json", "deep",
             "nested_task", "cut",
             "garbage", "bad_utf8", "bom", "binary", "text", "empty", "huge_int"]
        )
    )  # fmt: skip
    if kind == "task":
        return draw(task_texts()).encode()
    if kind == "json":
        return draw(json_texts).encode()
    if kind == "deep":
        inner = draw(st.sampled_from(["1", "[]", "{}", '"x"']))
        return _nest(draw(st.sampled_from(["list", "dict"])), inner, DEEP).encode()
    if kind == "nested_task":
        # Deep nesting inside an otherwise fine task: the whole message is still unreadable.
        deep = _nest(draw(st.sampled_from(["list", "dict"])), "0", DEEP)
        return _obj([f'"id":{draw(hex_ids)}', f'"n":{deep}']).encode()
    if kind == "huge_int":
        return _obj([f'"id":{draw(hex_ids)}', f'"n":{draw(huge_int)}']).encode()
    if kind == "cut":
        text = draw(task_texts()).encode()
        return text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    if kind == "garbage":
        return draw(task_texts()).encode() + draw(st.sampled_from([b"x", b"}", b",", b" {}"]))
    if kind == "bad_utf8":
        text = draw(task_texts()).encode()
        at = draw(st.integers(0, len(text)))
        bad = draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82", b"\x80"]))
        return text[:at] + bad + text[at:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + draw(task_texts()).encode()
    if kind == "binary":
        return draw(st.binary(max_size=64))
    if kind == "text":
        return draw(st.text(max_size=64)).encode()
    return b""


field_names = st.one_of(
    st.sampled_from(
        [b"payload", b"traceparent", b"", b"id", b"\xff\xfe", b"message\x00", b"MESSAGE"]
    ),
    st.binary(max_size=8).filter(lambda name: name != MESSAGE),
)


@st.composite
def entries(draw: st.DrawFn) -> Fields:
    """One stream entry's fields, at least one (XADD needs one), maybe ``message`` twice."""
    others = st.lists(st.tuples(field_names, st.binary(max_size=16)), max_size=2)
    fields: list[tuple[bytes, bytes]] = [*draw(others)]
    if draw(st.sampled_from([True] * 9 + [False])):  # nine in ten have a message field
        fields.append((MESSAGE, draw(message_values())))
        if draw(st.sampled_from([False] * 9 + [True])):
            fields.append((MESSAGE, draw(message_values())))  # the last one is read
    fields += draw(others)
    if not fields:
        fields.append((draw(field_names), draw(st.binary(max_size=32))))
    return tuple(fields)


def _filler(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


@st.composite
def huge_entries(draw: st.DrawFn) -> Fields:
    """An entry past Kafka's 1 MB request size, in the message or in another field."""
    kind = draw(
        st.sampled_from(
            ["task", "random", "deep", "int", "field", "traceparent", "many_fields", "no_id"]
        )
    )
    task_id = uuid.UUID(int=draw(st.integers(0, 2**128 - 1))).hex
    if kind == "task":
        return ((MESSAGE, _obj([f'"id":"{task_id}"', f'"blob":"{"x" * HUGE}"']).encode()),)
    if kind == "random":  # not UTF-8 (2 MB of random bytes never is), and incompressible
        return ((MESSAGE, _filler(draw(st.integers(0, 2**32)), HUGE)),)
    if kind == "deep":
        return ((MESSAGE, _nest("list", "", HUGE // 2).encode()),)
    if kind == "int":
        return ((MESSAGE, _obj([f'"id":"{task_id}"', f'"n":{"7" * HUGE}']).encode()),)
    if kind == "field":  # no message field: its other fields are what the DLQ must keep
        return ((b"payload", _filler(draw(st.integers(0, 2**32)), HUGE)),)
    if kind == "traceparent":
        return (
            (MESSAGE, _obj([f'"id":"{task_id}"', '"doc_id":"d"']).encode()),
            (b"traceparent", b"0" * HUGE),
        )
    if kind == "many_fields":  # 30,000 fields of a few bytes: per-header overhead adds up
        return tuple((f"f{n}".encode(), b"v" * 8) for n in range(30_000))
    return ((MESSAGE, _obj(['"doc_id":"d"', f'"blob":"{"y" * HUGE}"']).encode()),)


# --- Kafka, read back to the end offsets -----------------------------------------------------


@dataclass(frozen=True)
class Record(Mirrored):
    """A mirrored record, and the header names it carries more than once."""

    repeated_headers: tuple[str, ...]


class TopicTail:
    """Every record appended to the task topics and the DLQ since it started, read up to the
    end offsets at each call: no timing guesses, and a duplicate cannot hide."""

    def __init__(self, settings: Settings) -> None:
        self._consumer = AIOKafkaConsumer(
            **settings.kafka.client_kwargs(), group_id=None, enable_auto_commit=False
        )
        self._partitions = [TopicPartition(t, p) for t in OUT_TOPICS for p in range(TOPIC_PLAN[t])]

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_end(*self._partitions)
        for tp in self._partitions:
            await self._consumer.position(tp)  # resolve "end" now, before anything is written

    async def stop(self) -> None:
        await self._consumer.stop()

    async def read(self, streams: set[str]) -> list[Record]:
        """The records from ``streams`` (by ``x-redis-stream``) up to the current end offsets."""
        return await self.read_where(
            lambda r: dict(r.headers).get("x-redis-stream", b"").decode(errors="replace") in streams
        )

    async def read_where(self, wanted: Callable[[Any], bool]) -> list[Record]:
        """The records ``wanted`` picks out, read up to the end offsets as they are now."""
        end = await self._consumer.end_offsets(self._partitions)
        found: list[Record] = []
        deadline = time.monotonic() + 60
        while [tp for tp in self._partitions if await self._consumer.position(tp) < end[tp]]:
            assert time.monotonic() < deadline, "Kafka did not deliver up to its end offsets"
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                found += [_record(r) for r in records if wanted(r)]
        return found


def _record(r: Any) -> Record:
    """An aiokafka ``ConsumerRecord`` as read back, with the header names it repeats."""
    names = Counter(name for name, _ in r.headers)
    repeated = tuple(name for name, n in names.items() if n > 1)
    return Record(r.topic, r.key, r.value, dict(r.headers), r.partition, r.offset, repeated)


@pytest.fixture
async def tail(settings: Settings) -> AsyncIterator[TopicTail]:
    await init_topics(settings.kafka)
    reader = TopicTail(settings)
    await reader.start()
    yield reader
    await reader.stop()


# --- the mirror, in-process ------------------------------------------------------------------


def mirror_settings(base: Settings, stream: str) -> Settings:
    return Settings.from_env(
        {
            "REDIS_URL": f"redis://{base.redis.host}:{base.redis.port}/1",
            "KAFKA_BOOTSTRAP_SERVERS": ",".join(base.kafka.bootstrap_servers),
            "KAFKA_LINGER_MS": "1",
            "MIRROR_STREAMS": stream,
            "MIRROR_START": "earliest",
            "MIRROR_BLOCK_MS": "50",
        }
    )


async def xadd_all(client: avalkey.Valkey, stream: str, batch: Sequence[Fields]) -> list[str]:
    """XADD each entry as given, field order and repeated names included."""
    pipe = client.pipeline(transaction=False)
    for fields in batch:
        pipe.execute_command("XADD", stream, "*", *(part for pair in fields for part in pair))
    return [entry_id.decode() for entry_id in await pipe.execute()]


async def mirror_stream(settings: Settings, stream: str, total: int) -> Mirror:
    """Mirror ``stream`` until ``total`` entries were read; returns the stopped mirror."""
    async with running_mirror(mirror_settings(settings, stream)) as mirror:
        for _ in range(total + 100):
            if mirror.stats.read >= total:
                break
            await mirror.mirror_once()
        assert mirror.stats.read == total
    return mirror


@dataclass
class Tally:
    """What the property tried, printed when the test ends."""

    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    examples: int = 0
    entries: int = 0
    ends: Counter[str] = field(default_factory=Counter)  # topic or DLQ reason
    crashes: int = 0
    streams: list[str] = field(default_factory=list)

    @property
    def dead_lettered(self) -> int:
        return sum(n for end, n in self.ends.items() if not end.startswith("ragflow."))

    def line(self) -> str:
        reasons = ", ".join(f"{end}={n}" for end, n in sorted(self.ends.items()))
        return (
            f"hostile mirror: {self.examples} examples, {self.entries} entries, "
            f"{sum(self.ends.values()) - self.dead_lettered} in task topics, "
            f"{self.dead_lettered} in the DLQ, {self.crashes} crashes ({reasons})"
        )


@pytest.fixture
async def tally(settings: Settings, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Tally]:
    """The property's counts; at the end, reconcile's own accounting of every stream it wrote
    must agree: nothing missing or doubled, and the same number dead-lettered."""
    counts = Tally()
    yield counts
    report = None
    if counts.streams and not counts.crashes:
        report = await reconcile(
            mirror_settings(settings, counts.streams[0]),
            streams=counts.streams,
            since_ms=counts.started_ms,
        )
    with capsys.disabled():
        print(f"\n{counts.line()}")
        if report is not None:
            rows = report.streams.values()
            print(
                f"reconcile: {sum(r.written for r in rows)} written, "
                f"{sum(len(r.missing) for r in rows)} missing, "
                f"{sum(len(r.duplicated) for r in rows)} duplicated, "
                f"{sum(r.dead_lettered for r in rows)} dead-lettered"
            )
    assert counts.crashes == 0
    if report is not None:
        assert report.ok, report.to_dict()
        rows = report.streams.values()
        assert sum(r.written for r in rows) == counts.entries
        assert not any(r.duplicated for r in rows)
        assert sum(r.dead_lettered for r in rows) == counts.dead_lettered


def check_outcome(
    stream: str, ids: Sequence[str], batch: Sequence[Fields], found: Sequence[Record]
) -> Counter[str]:
    """Each entry exactly once where the oracle says, with its bytes and headers; returns how
    many ended where (a topic, or a DLQ reason)."""
    by_id: dict[str, list[Record]] = {}
    for record in found:
        by_id.setdefault(record.headers["x-redis-id"].decode(), []).append(record)
    assert set(by_id) <= set(ids), "records for entries never written"
    ends: Counter[str] = Counter()
    for entry_id, fields in zip(ids, batch, strict=True):
        records = by_id.get(entry_id, [])
        assert len(records) == 1, (entry_id, len(records), fields[:3])
        record, expected = records[0], expected_for(fields)
        assert not record.repeated_headers, record.repeated_headers
        value = dict(fields).get(MESSAGE)
        where = (record.topic, record.headers.get("x-error", b"").decode())
        assert where == (expected.topic, expected.reason or ""), (where, expected, fields[:3])
        assert record.headers["x-redis-stream"] == stream.encode()
        if expected.reason is None:
            assert record.value == value  # byte for byte, never re-serialised
            ends[record.topic] += 1
            continue
        original = value or b""
        assert record.headers["x-error-detail"]
        assert record.headers["x-original-size"] == str(len(original)).encode()
        assert record.value is not None and original.startswith(record.value)
        truncated = record.headers["x-truncated"] == b"true"
        assert truncated or record.value == original
        if value is None:
            assert record.headers["x-has-message-field"] == b"false"
            _check_fields_kept(fields, record)
        ends[expected.reason] += 1
    return ends


def _check_fields_kept(fields: Fields, record: Record) -> None:
    """An entry without a message field keeps its fields as headers, or flags them cut."""
    if record.headers["x-headers-truncated"] == b"true":
        return
    for name, value in dict(fields).items():
        header = "x-redis-field-" + name.decode("utf-8", "backslashreplace")
        assert record.headers.get(header) == value, header


@against_real_servers(EXAMPLES)
@given(
    batch=st.lists(entries(), min_size=5, max_size=15),
    # One example in eight adds a 2 MB entry: enough of them, without spending the run on them.
    huge=st.one_of(*[st.just([])] * 7, huge_entries().map(lambda entry: [entry])),
)
async def test_mirror_puts_every_hostile_entry_once_in_its_topic_or_the_dlq(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    tail: TopicTail,
    tally: Tally,
    batch: list[Fields],
    huge: list[Fields],
) -> None:
    everything = batch + huge
    stream = f"hostile-{uuid.uuid4().hex[:12]}"
    tally.examples += 1
    tally.entries += len(everything)
    tally.streams.append(stream)
    ids = await xadd_all(valkey_client, stream, everything)
    try:
        mirror = await mirror_stream(settings, stream, len(everything))
    except Exception:
        tally.crashes += 1
        raise
    pending = await valkey_client.xpending(stream, "ragflow_kafka_mirror")
    assert pending["pending"] == 0  # every entry acked: none left to replay
    ends = check_outcome(stream, ids, everything, await tail.read({stream}))
    assert sum(mirror.stats.dead_lettered.values()) == sum(
        n for end, n in ends.items() if not end.startswith("ragflow.")
    )
    tally.ends.update(ends)


# --- the mirror: one regression test per bug the property found -----------------------------

GOOD = b'{"id": "ok", "doc_id": "d"}'
# name: (the entry, the DLQ reason it must get). Each stopped the mirror before its fix, and
# left the entry pending: the mirror then stopped on it again at every restart.
MIRROR_BUGS: dict[str, tuple[Fields, str]] = {
    "int_past_4300_digits": (((MESSAGE, b'{"id": "a", "n": ' + b"9" * 5000 + b"}"),), "not_json"),
    "lone_surrogate_id": (((MESSAGE, b'{"id": "\\ud800"}'),), "not_unicode"),
    "lone_surrogate_doc_id": (((MESSAGE, b'{"id": "a", "doc_id": "\\udc80"}'),), "not_unicode"),
    "lone_surrogate_task_type": (((MESSAGE, b'{"id": "a", "task_type": "x\\ud800"}'),), "not_unicode"),
    "lone_surrogate_tenant_id": (((MESSAGE, b'{"id": "a", "tenant_id": "\\udfff"}'),), "not_unicode"),
    "field_name_not_utf8": (((b"\xff\xfename", b"v"),), "no_message_field"),
    "field_of_2mb": (((b"payload", b"p" * HUGE), (b"other", b"o")), "no_message_field"),
}  # fmt: skip


async def test_mirror_dead_letters_what_used_to_stop_it(
    settings: Settings, valkey_client: avalkey.Valkey, tail: TopicTail, unique: str
) -> None:
    batch = [entry for fields, _ in MIRROR_BUGS.values() for entry in (fields, ((MESSAGE, GOOD),))]
    started_ms = int(time.time() * 1000)
    ids = await xadd_all(valkey_client, unique, batch)
    await mirror_stream(settings, unique, len(batch))
    found = await tail.read({unique})
    ends = check_outcome(unique, ids, batch, found)
    assert ends == Counter(reason for _, reason in MIRROR_BUGS.values()) + Counter(
        {"ragflow.task.parse": len(MIRROR_BUGS)}
    )
    by_id = {r.headers["x-redis-id"].decode(): r for r in found}
    named = dict(zip(MIRROR_BUGS, ids[::2], strict=True))
    # A field name that is not UTF-8 is named by its bytes' escapes; the value is exact.
    assert by_id[named["field_name_not_utf8"]].headers["x-redis-field-\\xff\\xfename"] == b"v"
    # A 2 MB field is cut to fit the record, and says so; the entry is whole in Redis.
    big = by_id[named["field_of_2mb"]]
    assert big.headers["x-headers-truncated"] == b"true"
    assert big.headers["x-redis-field-payload"] == b"p" * len(big.headers["x-redis-field-payload"])
    assert len(big.headers["x-redis-field-payload"]) > MAX_REQUEST_BYTES // 2
    assert b"surrogate" in by_id[named["lone_surrogate_doc_id"]].headers["x-error-detail"]

    report = await reconcile(
        mirror_settings(settings, unique), streams=[unique], since_ms=started_ms
    )
    row = report.streams[unique]
    assert report.ok and row.missing == [] and row.duplicated == {}
    assert (row.written, row.dead_lettered, row.in_task_topics) == (
        len(batch),
        len(MIRROR_BUGS),
        len(MIRROR_BUGS),
    )


def test_decode_task_names_json_past_python_limits() -> None:
    for value in (b'{"n": ' + b"1" * 4301 + b"}", b"[" * DEEP + b"]" * DEEP):
        with pytest.raises(MessageDecodeError) as caught:
            decode_task(value)
        assert caught.value.reason == "not_json"


def test_a_dead_letter_always_fits_the_request_size() -> None:
    """Whatever the value, the copied headers and the names: under max_request_size."""
    limit = 100_000
    record = dead_letter(
        reason="no_message_field",
        detail="x" * 5000,
        value=b"v" * (2 * limit),
        stream="s" * 5000,
        entry_id="1-0" * 5000,
        stage="shadow",
        max_value_bytes=limit,
        extra_headers=tuple((f"h{n}", b"h" * 10_000) for n in range(50)),
    )
    size = len(record.value_bytes()) + len(record.key_bytes() or b"")
    size += sum(len(name.encode()) + len(value) + 16 for name, value in record.headers)
    assert size <= limit
    headers = dict(record.headers)
    assert headers["x-truncated"] == headers["x-headers-truncated"] == b"true"
    assert headers["x-original-size"] == str(2 * limit).encode()
    # A copied header of one of its own names does not override it for a last-wins reader.
    spoofed = dead_letter(
        reason="not_json", detail="", value=b"", stream="s", entry_id="1-0", stage="shadow",
        max_value_bytes=limit, extra_headers=(("x-error", b"spoof"),),
    )  # fmt: skip
    assert dict(spoofed.headers)["x-error"] == b"not_json"


# --- the shadow consumer: records written straight into the task topics --------------------

SHADOW_TOPICS = [PARSE_TOPIC, PARSE_PRIORITY_TOPIC]
HEADER_NAMES = ["x-redis-stream", "x-redis-id", "x-task-id", "x-task-type", "x-retry-count", "x-timestamp", "x-priority", "x-tenant-id", "traceparent", "x-error"]  # fmt: skip
STREAM_TOKEN = b"<the example's stream>"  # replaced when produced, so refs never collide
header_values = st.one_of(
    st.binary(max_size=16),
    st.sampled_from([b"", b"\xff\xfe", "²".encode(), "١٢".encode(), b"-1", b"1-0|x", b"abc"]),
    st.integers(0, 2**70).map(lambda n: f"{n}-{n % 7}".encode()),
    st.just(STREAM_TOKEN),
    st.integers(4_300, 5_000).map(lambda n: b"9" * n),
)


@dataclass(frozen=True)
class KafkaRecord:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@st.composite
def kafka_records(draw: st.DrawFn) -> KafkaRecord:
    """A record as anyone could write it into a task topic: value and headers broken or not."""
    headers = draw(st.lists(st.tuples(st.sampled_from(HEADER_NAMES), header_values), max_size=5))
    if draw(st.sampled_from([True, True, False])):  # the mirror's two headers, valid or not
        entry_id = f"{draw(st.integers(0, 2**48))}-{draw(st.integers(0, 9))}".encode()
        headers[:0] = [("x-redis-stream", STREAM_TOKEN), ("x-redis-id", entry_id)]
    if draw(st.sampled_from([False] * 9 + [True])):  # 300 KB: a third of the record limit
        headers.append((draw(st.sampled_from(HEADER_NAMES)), b"h" * 300_000))
    value = None if draw(st.sampled_from([False] * 9 + [True])) else draw(message_values())
    # A null value is a tombstone, which needs a key.
    key = draw(
        st.binary(max_size=8) if value is None else st.one_of(st.none(), st.binary(max_size=8))
    )
    return KafkaRecord(draw(st.sampled_from(SHADOW_TOPICS)), key, value, tuple(headers))


def shadow_ref(record: KafkaRecord, partition: int, offset: int) -> EntryRef:
    """The entry a record stands for: the one its last x-redis-stream/x-redis-id name, when
    those are a stream name and an entry id; otherwise the record itself."""
    headers = dict(record.headers)
    stream, entry_id = headers.get("x-redis-stream", b""), headers.get("x-redis-id", b"")
    with contextlib.suppress(UnicodeDecodeError):
        if stream and len(stream) <= 512 and re.fullmatch(rb"[0-9]{1,20}-[0-9]{1,20}", entry_id):
            return EntryRef(stream.decode(), entry_id.decode())
    return EntryRef(f"kafka:{record.topic}", f"{partition}-{offset}")


def shadow_dlq_reason(value: bytes | None) -> str | None:
    """Why the shadow must dead-letter a record's value, or ``None`` when it is a task."""
    if value is None:
        return "no_value"
    reason = expected_for(((MESSAGE, value),)).reason
    if reason in ("not_utf8", "not_json", "not_object"):
        return reason
    task_id = json.loads(value).get("id")
    return "not_unicode" if not _encodable(task_id) else None


@dataclass
class ShadowRun:
    """A running sidecar with only its shadow side, and the counts of what it was given."""

    sidecar: Sidecar
    loops: asyncio.Task[None]
    admin: AIOKafkaAdminClient
    producer: AIOKafkaProducer
    examples: int = 0
    records: int = 0
    ends: Counter[str] = field(default_factory=Counter)  # DLQ reason, or "handled"

    async def committed_past(self, last: dict[TopicPartition, int]) -> None:
        """Wait until the group committed past ``last`` (or fail at once if a loop died)."""
        group = self.sidecar.settings.shadow.group
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.loops.done():
                self.loops.result()  # the shadow crashed: raise what stopped it
                raise AssertionError("the sidecar stopped")
            offsets = await self.admin.list_consumer_group_offsets(group, partitions=list(last))
            if all(offsets[tp] is not None and offsets[tp].offset > o for tp, o in last.items()):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the shadow did not commit past {last}")


@pytest.fixture
async def shadow_run(
    settings: Settings, unique: str, capsys: pytest.CaptureFixture[str]
) -> AsyncIterator[ShadowRun]:
    await init_topics(settings.kafka)
    config = sidecar_settings(settings, [f"{unique}.0"], unique)  # the ragflow dry-run handler
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    producer = AIOKafkaProducer(**settings.kafka.client_kwargs(), max_request_size=2_000_000)
    await producer.start()
    async with Sidecar(config, mirror=False, observer=False) as sidecar:
        assert sidecar.shadow is not None
        await sidecar.shadow.wait_ready()
        stop = asyncio.Event()
        run = ShadowRun(sidecar, asyncio.create_task(sidecar.run(stop)), admin, producer)
        yield run
        stop.set()
        await asyncio.wait_for(run.loops, timeout=60)
    await producer.stop()
    await admin.close()
    if run.examples:
        with capsys.disabled():
            reasons = ", ".join(f"{end}={n}" for end, n in sorted(run.ends.items()))
            print(f"\nhostile shadow: {run.examples} examples, {run.records} records, 0 crashes "
                  f"({reasons})")  # fmt: skip


async def produce_records(
    producer: AIOKafkaProducer, stream: str, batch: Sequence[KafkaRecord]
) -> list[tuple[int, int]]:
    """Write ``batch`` as is (the example's stream in place of the token); (partition, offset)."""
    sent = [
        await producer.send(
            record.topic, record.value, key=record.key, headers=list(_with_stream(record, stream))
        )
        for record in batch
    ]
    return [((done := await future).partition, done.offset) for future in sent]


async def check_shadow_outcome(
    run: ShadowRun,
    client: avalkey.Valkey,
    tail: TopicTail,
    stream: str,
    batch: Sequence[KafkaRecord],
    where: Sequence[tuple[int, int]],
) -> Counter[str]:
    """The shadow committed past every record; each has its kafka run in the join (so a
    verdict), and is in the DLQ once, with its bytes, exactly when its value is no task."""
    last: dict[TopicPartition, int] = {}
    for record, (partition, offset) in zip(batch, where, strict=True):
        tp = TopicPartition(record.topic, partition)
        last[tp] = max(last.get(tp, -1), offset)
    await run.committed_past(last)
    sources = {f"{r.topic}|{p}:{o}" for r, (p, o) in zip(batch, where, strict=True)}
    dead = await tail.read_where(
        lambda r: (
            r.topic == DLQ_TOPIC
            and f"{_header(r, 'x-source-topic')}|{_header(r, 'x-source-offset')}" in sources
        )
    )
    by_source = Counter(f"{r.headers['x-source-topic'].decode()}|{r.headers['x-source-offset'].decode()}" for r in dead)  # fmt: skip
    assert max(by_source.values(), default=0) <= 1, "a record dead-lettered twice"
    dead_by_source = {
        f"{r.headers['x-source-topic'].decode()}|{r.headers['x-source-offset'].decode()}": r
        for r in dead
    }
    ends: Counter[str] = Counter()
    for record, (partition, offset) in zip(batch, where, strict=True):
        ref = shadow_ref(
            KafkaRecord(record.topic, record.key, record.value, _with_stream(record, stream)),
            partition,
            offset,
        )
        assert await client.hexists(ref.key, "kafka_run"), ("no kafka run", ref, record)
        reason = shadow_dlq_reason(record.value)
        letter = dead_by_source.get(f"{record.topic}|{partition}:{offset}")
        if reason is None:
            # A task: handled, or dead-lettered because the handler kept failing on it.
            assert letter is None or letter.headers["x-error"] == b"handler_failed", letter
            ends["handler_failed" if letter else "handled"] += 1
            continue
        assert letter is not None, ("not dead-lettered", reason, record)
        assert letter.headers["x-error"] == reason.encode(), (letter.headers["x-error"], reason)
        assert letter.headers["x-stage"] == b"shadow"
        original = record.value or b""
        assert letter.value is not None and original.startswith(letter.value)
        assert letter.headers["x-truncated"] == b"true" or letter.value == original
        ends[reason] += 1
    return ends


def _header(record: Any, name: str) -> str:
    return dict(record.headers).get(name, b"").decode(errors="replace")


def _with_stream(record: KafkaRecord, stream: str) -> tuple[tuple[str, bytes], ...]:
    return tuple((n, stream.encode() if v == STREAM_TOKEN else v) for n, v in record.headers)


@against_real_servers(SHADOW_EXAMPLES)
@given(batch=st.lists(kafka_records(), min_size=3, max_size=12))
async def test_shadow_commits_past_every_hostile_record_and_accounts_for_it(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    tail: TopicTail,
    shadow_run: ShadowRun,
    batch: list[KafkaRecord],
) -> None:
    stream = f"hostile-{uuid.uuid4().hex[:12]}"
    where = await produce_records(shadow_run.producer, stream, batch)
    ends = await check_shadow_outcome(shadow_run, valkey_client, tail, stream, batch, where)
    shadow_run.examples += 1
    shadow_run.records += len(batch)
    shadow_run.ends.update(ends)


def _task() -> bytes:
    return json.dumps(
        {"id": uuid.uuid4().hex, "doc_id": "d", "from_page": 0, "to_page": 1}
    ).encode()


# name: (value, headers, the DLQ reason or None). Each stopped the whole sidecar before its fix,
# with the record uncommitted: it stopped again on it at every restart.
SHADOW_BUGS: dict[str, tuple[bytes | None, list[tuple[str, bytes]], str | None]] = {
    "no_x_redis_id": (_task(), [], None),  # ordering: parse_entry_id("") raised
    "x_redis_id_not_an_id": (_task(), [("x-redis-stream", b"s"), ("x-redis-id", b"abc")], None),
    "x_retry_count_not_a_number": (_task(), [("x-retry-count", b"abc")], None),
    "x_timestamp_superscript": (_task(), [("x-timestamp", "²".encode())], None),
    "x_timestamp_5000_digits": (_task(), [("x-timestamp", b"9" * 5000)], None),
    "x_priority_superscript": (_task(), [("x-priority", "²".encode())], None),
    "lone_surrogate_id": (b'{"id": "\\ud800"}', [], "not_unicode"),  # the cancel-key lookup
    "null_value": (None, [], "no_value"),  # was "no_message_field", which points at Redis
    "int_past_4300_digits": (b'{"id": "a", "n": ' + b"9" * 5000 + b"}", [], "not_json"),
    "900kb_header": (b"{broken", [("x-task-type", b"t" * 900_000)], "not_json"),  # DLQ too big
}  # fmt: skip


async def test_shadow_survives_what_used_to_stop_it_and_judges_every_record(
    settings: Settings,
    valkey_client: avalkey.Valkey,
    tail: TopicTail,
    shadow_run: ShadowRun,
    unique: str,
) -> None:
    batch = [
        KafkaRecord(PARSE_TOPIC, name.encode(), value, tuple(headers))
        for name, (value, headers, _) in SHADOW_BUGS.items()
    ]
    where = await produce_records(shadow_run.producer, unique, batch)
    ends = await check_shadow_outcome(shadow_run, valkey_client, tail, unique, batch, where)
    assert ends == Counter(reason or "handled" for _, _, reason in SHADOW_BUGS.values())
    # Each is judged: none has a Redis counterpart, so missing_in_redis once the timeout passes.
    refs = {shadow_ref(r, p, o) for r, (p, o) in zip(batch, where, strict=True)}
    finals = await final_verdicts(settings, refs)
    assert finals == Counter((ref.stream, ref.entry_id, "missing_in_redis") for ref in refs)


async def final_verdicts(
    settings: Settings, refs: set[EntryRef], timeout_s: float = 60.0
) -> Counter[tuple[str, str, str]]:
    """The final verdicts about ``refs``, read until each has one and then a little longer
    (so a second one would show); other tests' verdicts on the same streams are passed over."""
    found: Counter[tuple[str, str, str]] = Counter()
    async with KafkaConsumer(settings.kafka, [VERDICTS_TOPIC], f"v-{uuid.uuid4().hex}") as reader:
        deadline, quiet = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            batch = await reader.poll_batch(5000, 300)
            for message in batch:
                verdict = parse_verdict(message.value or b"")
                ref = EntryRef(verdict["stream"], verdict["entry_id"])
                if ref in refs and verdict["verdict"] != "duplicate":
                    found[ref.stream, ref.entry_id, verdict["verdict"]] += 1
            quiet = 0 if batch else quiet + 1
            if len({(s, e) for s, e, _ in found}) == len(refs) and quiet >= 3:
                break
    return found
