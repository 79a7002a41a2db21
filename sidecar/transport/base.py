"""The producer and consumer interfaces both backends implement."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sidecar.errors import SidecarError
from sidecar.lifecycle import Lifecycle
from sidecar.transport.message import QueueMessage, encode_task

Headers = Sequence[tuple[str, bytes]]


# Both are NamedTuples, not dataclasses: the mirror makes one of each per task, and a
# frozen dataclass costs several times more to build on that hot path.
class SendResult(NamedTuple):
    """Where a produced message was stored: a stream entry id, or a topic/partition/offset."""

    destination: str
    id: str
    partition: int = -1
    offset: int = -1


class OutgoingMessage(NamedTuple):
    """One message to produce; ``value`` is sent as is when bytes, else as RAGFlow's JSON."""

    destination: str
    value: bytes | Mapping[str, Any]
    key: str | bytes | None = None
    headers: Headers = ()
    # Kafka only: the partition chosen by the caller (None: by the key, as Kafka places it).
    partition: int | None = None

    def value_bytes(self) -> bytes:
        return self.value if isinstance(self.value, bytes) else encode_task(self.value)

    def key_bytes(self) -> bytes | None:
        return self.key.encode("utf-8") if isinstance(self.key, str) else self.key


class MessageQueueProducer(Lifecycle):
    """Writes messages to a Redis stream or a Kafka topic."""

    async def send(
        self,
        destination: str,
        value: bytes | Mapping[str, Any],
        *,
        key: str | bytes | None = None,
        headers: Headers = (),
    ) -> SendResult:
        """Produce one message and wait until the server has it; raises ``SidecarError``."""
        outcome = (await self.send_many([OutgoingMessage(destination, value, key, headers)]))[0]
        if isinstance(outcome, SidecarError):
            raise outcome
        return outcome

    @abstractmethod
    async def send_many(
        self, messages: Sequence[OutgoingMessage]
    ) -> list[SendResult | SidecarError]:
        """Produce a batch; one outcome per message, in order: where it went, or why not."""

    @abstractmethod
    async def flush(self) -> None:
        """Wait until everything sent so far is acknowledged."""


class MessageQueueConsumer(Lifecycle):
    """Reads messages in a consumer group; each message is acked or nacked through it."""

    async def poll(self, timeout_ms: int = 5000) -> QueueMessage | None:
        """The next message, or ``None`` when none arrived within ``timeout_ms``."""
        batch = await self.poll_batch(1, timeout_ms)
        return batch[0] if batch else None

    @abstractmethod
    async def poll_batch(self, max_records: int, timeout_ms: int) -> list[QueueMessage]:
        """Up to ``max_records`` messages, waiting at most ``timeout_ms`` for the first."""

    @abstractmethod
    async def ack(self, message: QueueMessage) -> None:
        """The message is done: XACK, or commit up to the lowest unfinished offset."""

    @abstractmethod
    async def nack(self, message: QueueMessage, delay_ms: int = 0) -> None:
        """Deliver the message again after ``delay_ms``; it stays pending until acked."""
