"""Round trips through both backends via the factory, and the outcome digest."""

from __future__ import annotations

import pytest

from comparators import canonical_json, outcome_digest
from sidecar.cli.roundtrip import round_trip
from sidecar.config import Settings
from sidecar.transport import KafkaProducer, RedisStreamProducer, create_consumer, create_producer
from sidecar.transport.topics import init_topics


async def test_factory_chooses_the_backend(settings: Settings) -> None:
    parts = {"redis": settings.redis, "kafka": settings.kafka}
    assert isinstance(create_producer(settings.mq_backend, **parts), RedisStreamProducer)  # default
    assert isinstance(create_producer("kafka", **parts), KafkaProducer)
    with pytest.raises(ValueError, match="must be named"):
        create_consumer(settings.mq_backend, ["s"], consumer_name="c", **parts)


@pytest.mark.parametrize("backend", ["redis", "kafka"])
async def test_round_trip_is_byte_identical(settings: Settings, backend: str) -> None:
    await init_topics(settings.kafka)
    trip = await round_trip(settings, backend)  # type: ignore[arg-type]
    assert trip.identical
    assert trip.sent_id == trip.received_id


def test_digest_ignores_key_order_but_not_values() -> None:
    a = {"kind": "parse", "pages": [0, 12], "meta": {"x": 1, "y": "ü"}}
    b = {"meta": {"y": "ü", "x": 1}, "pages": [0, 12], "kind": "parse"}
    assert canonical_json(a) == canonical_json(b)
    assert outcome_digest(a) == outcome_digest(b)
    assert outcome_digest(a) != outcome_digest({**a, "pages": [0, 13]})
    with pytest.raises(ValueError):
        outcome_digest({"bad": float("nan")})
