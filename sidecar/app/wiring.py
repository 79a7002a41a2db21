"""The clients of one build of the sidecar, made here and nowhere else, and their start order.

Every Valkey client and Kafka producer the parts use is built once by the composition root
(:class:`sidecar.app.service.Sidecar`, or :class:`StandaloneMirror` for ``ragflow-sidecar
mirror``) and handed to them; the root starts the clients before the parts and stops them
after. Which are shared:

- the state store's Valkey client (:class:`CompareClients`, ``SIDECAR_STATE_URL``): the judge's
  join, the sweeper, the shadow's dedup and liveness keys, and the readiness probe;
- a client of RAGFlow's Valkey (``REDIS_URL``) for what RAGFlow's processes write: the cancel
  keys (the shadow, the redis run) and the served share's evidence and cap (the poller); the
  state store's client itself when ``SIDECAR_STATE_URL`` is unset (the same server and db);
- one producer for what the sidecar publishes itself: verdicts and the shadow's dead letters;
- the mirror's own Valkey client and producer (:class:`MirrorClients`): its XREADGROUP blocks a
  connection for up to ``MIRROR_BLOCK_MS``, and it restarts its producer when Kafka refuses the
  producer's sequence numbers, which must not cut off anyone else's sends;
- the observer's own Valkey client, with a socket timeout (:func:`observer_client`).

A build is used once: the supervisor builds a new one after a failure (new clients too).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import valkey.asyncio as valkey

from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.mirror.mirror import AfterProduce, Mirror, RecordTransform
from sidecar.mirror.records import MAX_REQUEST_BYTES
from sidecar.shadow.shadow import MAX_DLQ_BYTES
from sidecar.telemetry.tracing import Tracing
from sidecar.transport.kafka import KafkaProducer
from sidecar.transport.options import RedisSettings
from sidecar.transport.topics import TASK_TOPICS
from sidecar.transport.valkey_client import create_client, translate_valkey_errors
from sidecar.verdicts.judge import Judge
from sidecar.verdicts.progress import ShadowProgress

# The codec of the compare side's records (verdicts, the shadow's dead letters), whatever the
# task topics' KAFKA_COMPRESSION_TYPE: one verdict per task, and gzip (aiokafka's, at level 9)
# cost a twentieth of a verdict's CPU. lz4 takes a twentieth of gzip's time on 200 verdicts, for
# a ratio of 15x against gzip's 26x.
PUBLISHER_COMPRESSION = "lz4"

# A bounded socket timeout keeps a hung server from stalling an observer round for ever.
OBSERVER_SOCKET_TIMEOUT_S = 10


class ValkeyClient(Lifecycle):
    """A Valkey client of the root's: closed at stop; with ``ping``, asked to answer at start,
    so that a wrong address or a refused login fails the start rather than the first task."""

    def __init__(self, settings: RedisSettings, *, ping: bool = False, **overrides: Any) -> None:
        super().__init__()
        self.client: valkey.Valkey = create_client(settings, **overrides)
        self._ping = ping
        self._where = settings.display_url

    async def _start(self) -> None:
        if not self._ping:
            return  # connects on first use
        try:
            with translate_valkey_errors("PING", self._where):
                await self.client.ping()
        except BaseException:
            await self.client.aclose()  # stop() does nothing on what never started
            raise

    async def _stop(self) -> None:
        await self.client.aclose()


def observer_client(settings: RedisSettings) -> ValkeyClient:
    """The worker observer's client: its own, for its socket timeout."""
    return ValkeyClient(settings, socket_timeout=OBSERVER_SOCKET_TIMEOUT_S)


@dataclass(frozen=True)
class CompareClients:
    """The state store's Valkey client, RAGFlow's Valkey client (the same one when the state
    store is RAGFlow's Valkey), the publisher of verdicts and dead letters, and the shadow
    group's progress (the sweeper's evidence)."""

    state: ValkeyClient
    ragflow: ValkeyClient
    publisher: KafkaProducer
    progress: ShadowProgress

    @classmethod
    def build(cls, settings: Settings) -> CompareClients:
        state = ValkeyClient(settings.state, ping=True)
        return cls(
            state,
            state if settings.state == settings.redis else ValkeyClient(settings.redis, ping=True),
            KafkaProducer(
                settings.kafka,
                max_request_size=MAX_DLQ_BYTES,
                compression_type=PUBLISHER_COMPRESSION,
            ),
            # The topics the shadow consumer reads (its commits are the evidence).
            ShadowProgress(settings.kafka, settings.shadow.group, TASK_TOPICS),
        )

    @property
    def separate(self) -> bool:
        """Whether the state store is a server (or db) of its own, apart from RAGFlow's."""
        return self.ragflow is not self.state

    @property
    def parts(self) -> tuple[Lifecycle, ...]:
        valkeys = (self.state, self.ragflow) if self.separate else (self.state,)
        return (*valkeys, self.publisher, self.progress)

    def judge(self, settings: Settings, tracing: Tracing) -> Judge:
        """A judge on these clients."""
        return Judge(
            settings,
            join_client=self.state.client,
            publisher=self.publisher,
            tracing=tracing,
            batch_limit=settings.shadow.join_batch,
        )


@dataclass(frozen=True)
class MirrorClients:
    """The mirror's Valkey client (for its blocking reads) and its producer."""

    streams: ValkeyClient
    producer: KafkaProducer

    @classmethod
    def build(cls, settings: Settings) -> MirrorClients:
        return cls(
            ValkeyClient(settings.redis),
            KafkaProducer(settings.kafka, max_request_size=MAX_REQUEST_BYTES),
        )

    @property
    def parts(self) -> tuple[Lifecycle, ...]:
        return (self.streams, self.producer)

    def mirror(
        self,
        settings: Settings,
        tracing: Tracing,
        *,
        after_produce: AfterProduce | None = None,
        transform: RecordTransform | None = None,
    ) -> Mirror:
        """A mirror on these clients."""
        return Mirror(
            settings,
            client=self.streams.client,
            producer=self.producer,
            tracing=tracing,
            after_produce=after_produce,
            transform=transform,
        )


async def start_in_order(parts: Sequence[Lifecycle]) -> None:
    """Start ``parts`` in order; when one fails, stop those started (last first) and raise.

    A failed start is retried by the supervisor with a new build: nothing of this one may be
    left connected (``stop()`` does nothing on a build that never started).
    """
    started: list[Lifecycle] = []
    try:
        for part in parts:
            await part.start()
            started.append(part)
    except BaseException:
        for part in reversed(started):
            with contextlib.suppress(SidecarError):
                await part.stop()
        raise


async def stop_in_reverse(parts: Sequence[Lifecycle]) -> None:
    """Stop ``parts`` last first, each even if one stopped before it failed; the first
    failure is raised once all are stopped."""
    errors: list[SidecarError] = []
    for part in reversed(parts):
        try:
            await part.stop()
        except SidecarError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


class Assembly(Lifecycle):
    """Clients and the parts using them, started in order and stopped in reverse."""

    def __init__(self, parts: Iterable[Lifecycle | None]) -> None:
        super().__init__()
        self.parts = tuple(part for part in parts if part is not None)

    async def _start(self) -> None:
        await start_in_order(self.parts)

    async def _stop(self) -> None:
        await stop_in_reverse(self.parts)


class StandaloneMirror(Assembly):
    """``ragflow-sidecar mirror``: the mirror alone, with its clients and tracing."""

    def __init__(
        self,
        settings: Settings,
        *,
        after_produce: AfterProduce | None = None,
        transform: RecordTransform | None = None,
    ) -> None:
        tracing = Tracing(settings.tracing, settings.shadow.instance)
        clients = MirrorClients.build(settings)
        self.mirror = clients.mirror(
            settings, tracing, after_produce=after_produce, transform=transform
        )
        super().__init__((tracing, *clients.parts, self.mirror))

    async def run(self, stop: asyncio.Event) -> None:
        """Mirror until ``stop`` is set."""
        await self.mirror.run(stop)


@contextlib.asynccontextmanager
async def running_mirror(settings: Settings, **kwargs: Any) -> AsyncIterator[Mirror]:
    """A started :class:`StandaloneMirror`'s mirror, stopped on exit (tests and the bench)."""
    async with StandaloneMirror(settings, **kwargs) as wired:
        yield wired.mirror


@contextlib.asynccontextmanager
async def running_judge(settings: Settings) -> AsyncIterator[Judge]:
    """A judge on started clients of its own, stopped on exit (tests)."""
    tracing = Tracing(settings.tracing, settings.shadow.instance)
    clients = CompareClients.build(settings)
    judge = clients.judge(settings, tracing)
    async with Assembly((tracing, *clients.parts)):
        yield judge
