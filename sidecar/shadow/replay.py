"""The redis run: the shadow handler run on the copy the mirror read from Redis.

The mirror calls a :class:`RedisRunRecorder` with each batch it put in Kafka, before it XACKs
the batch, so a crash replays the redis run too (the join stores a side once). With
``SHADOW_NOISE_RUNS`` the handler runs that many extra times; paths that differ between those
runs are noise and are excluded from the comparison with the Kafka path.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import valkey.asyncio as valkey
from opentelemetry.trace import Status, StatusCode

from comparators import NoiseBaseline
from sidecar.shadow.dedup import cancel_keys_set
from sidecar.shadow.handlers import HandlerResult, NamedHandler, TaskMeta, run_handler
from sidecar.shadow.trace import redis_run_span
from sidecar.transport import fastjson
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.message import QueueMessage, header_text
from sidecar.transport.valkey_client import translate_valkey_errors
from sidecar.verdicts.join import Arrival, EntryRef
from sidecar.verdicts.judge import Judge, digest_or_none

# A failed redis run's error on its span, at most this long.
MAX_ERROR_CHARS = 300


def value_sha(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


class RedisRunRecorder:
    """Runs the handler on the Redis copies of a mirrored batch and records the redis runs."""

    def __init__(
        self, judge: Judge, handler: NamedHandler, noise_runs: int = 0, *, client: valkey.Valkey
    ) -> None:
        """``client`` is the composition root's client of RAGFlow's Valkey, for the cancel keys
        (the redis runs are recorded by ``judge``, in the state store)."""
        self._judge = judge
        self._handler = handler
        self._noise_runs = noise_runs
        self._client = client
        self._where = judge.settings.redis.display_url

    async def __call__(self, mirrored: Sequence[tuple[QueueMessage, OutgoingMessage]]) -> None:
        if not mirrored:
            return
        acked_ms = int(time.time() * 1000)
        # Decoded by the mirror already, which routed them: the payload is cached.
        tasks = [message.payload for message, _ in mirrored]
        with translate_valkey_errors("look up the cancel keys", self._where):
            cancelled = await cancel_keys_set(
                self._client, [f"{t.get('id')}-cancel" for t in tasks]
            )
        arrivals = []
        traced = self._judge.tracing.enabled
        for (message, record), task, is_cancelled in zip(mirrored, tasks, cancelled, strict=True):
            meta = TaskMeta(
                path="redis",
                stream=message.topic,
                entry_id=message.id,
                topic=None,
                partition=None,
                offset=None,
                attempt=1,
                cancelled=is_cancelled,
            )
            traceparent = header_text(record.headers, "traceparent") if traced else None
            span = (
                redis_run_span(
                    self._judge.tracing,
                    traceparent,
                    message.id,
                    str(header_text(record.headers, "x-task-id") or ""),
                    str(header_text(record.headers, "x-task-type") or ""),
                )
                if traced
                else None
            )
            runs = [await run_handler(self._handler, task, meta)]
            for _ in range(self._noise_runs if runs[0].ok else 0):
                runs.append(await run_handler(self._handler, task, meta))
            if span is not None:
                if runs[0].error:
                    span.set_status(Status(StatusCode.ERROR, runs[0].error[:MAX_ERROR_CHARS]))
                span.end()
            assert message.value is not None  # decoded above
            facts = self._facts(message, record, runs, acked_ms)
            if traced:  # the record's producer context, for the verdict's span to link to
                facts["traceparent"] = traceparent
            arrivals.append(
                Arrival(
                    EntryRef(message.topic, message.id),
                    fastjson.dumps(facts),
                    message.value,
                    value_sha=facts["value_sha"],
                )
            )
        await self._judge.record("redis_run", arrivals)

    def _facts(
        self,
        message: QueueMessage,
        record: OutgoingMessage,
        runs: list[HandlerResult],
        acked_ms: int,
    ) -> dict[str, Any]:
        first = runs[0]
        noise = NoiseBaseline.from_runs([run.outcome for run in runs if run.ok])
        assert message.value is not None
        return {
            "task_id": header_text(record.headers, "x-task-id"),
            "task_type": header_text(record.headers, "x-task-type"),
            "priority": int(header_text(record.headers, "x-priority") or 0),
            "stream": message.topic,
            "topic": record.destination,
            "key": record.key if isinstance(record.key, str) else None,
            "value_sha": value_sha(message.value),
            "outcome": first.outcome,
            "error": first.error,
            "digest": digest_or_none(first.outcome) if first.ok else None,
            "noise_paths": sorted(noise.paths),
            "processing_ms": round(first.elapsed_ms, 3),
            "mirror_latency_ms": acked_ms - message.timestamp_ms,
        }
