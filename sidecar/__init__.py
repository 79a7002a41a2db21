"""ragflow-kafka-sidecar: move RAGFlow's task queue from Redis Streams to Kafka gradually.

The public API is what ``__all__`` names; every other module is private by convention and may
change between releases. The names load on first use, so that importing one part (as
``ragflow_mq`` does inside RAGFlow's processes) does not import the whole sidecar.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sidecar.version import __version__

# Public name → the module that defines it.
_EXPORTS: dict[str, str] = {
    "Settings": "sidecar.config",
    "SidecarError": "sidecar.errors",
    "ConfigError": "sidecar.errors",
    "ServiceUnavailableError": "sidecar.errors",
    "AuthenticationError": "sidecar.errors",
    "AuthorizationError": "sidecar.errors",
    "MessageQueueError": "sidecar.errors",
    "RetriableMessageQueueError": "sidecar.errors",
    "MessageDecodeError": "sidecar.errors",
    "Sidecar": "sidecar.app.service",
    "run_until_signal": "sidecar.app.supervisor",
    "Mirror": "sidecar.mirror.mirror",
    "ShadowConsumer": "sidecar.shadow.shadow",
    "VerdictRecord": "sidecar.verdicts.model",
    "VERDICTS": "sidecar.verdicts.model",
    "read_verdicts": "sidecar.verdicts.reader",
    "QueueMessage": "sidecar.transport.message",
    "OutgoingMessage": "sidecar.transport.base",
    "KafkaProducer": "sidecar.transport.kafka",
    "KafkaConsumer": "sidecar.transport.kafka",
    "RedisStreamProducer": "sidecar.transport.redis_streams",
    "RedisStreamConsumer": "sidecar.transport.redis_streams",
}

__all__ = [
    "VERDICTS",
    "AuthenticationError",
    "AuthorizationError",
    "ConfigError",
    "KafkaConsumer",
    "KafkaProducer",
    "MessageDecodeError",
    "MessageQueueError",
    "Mirror",
    "OutgoingMessage",
    "QueueMessage",
    "RedisStreamConsumer",
    "RedisStreamProducer",
    "RetriableMessageQueueError",
    "ServiceUnavailableError",
    "Settings",
    "ShadowConsumer",
    "Sidecar",
    "SidecarError",
    "VerdictRecord",
    "__version__",
    "read_verdicts",
    "run_until_signal",
]

if TYPE_CHECKING:
    from sidecar.app.service import Sidecar
    from sidecar.app.supervisor import run_until_signal
    from sidecar.config import Settings
    from sidecar.errors import (
        AuthenticationError,
        AuthorizationError,
        ConfigError,
        MessageDecodeError,
        MessageQueueError,
        RetriableMessageQueueError,
        ServiceUnavailableError,
        SidecarError,
    )
    from sidecar.mirror.mirror import Mirror
    from sidecar.shadow.shadow import ShadowConsumer
    from sidecar.transport.base import OutgoingMessage
    from sidecar.transport.kafka import KafkaConsumer, KafkaProducer
    from sidecar.transport.message import QueueMessage
    from sidecar.transport.redis_streams import RedisStreamConsumer, RedisStreamProducer
    from sidecar.verdicts.model import VERDICTS, VerdictRecord
    from sidecar.verdicts.reader import read_verdicts


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
