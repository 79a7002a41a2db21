"""Real Valkey and Apache Kafka servers on 127.0.0.1, for the demo and the tests."""

from sidecar.dev.local_stack.kafka import LocalKafka, fetch_kafka_jars
from sidecar.dev.local_stack.stack import LocalStack, ServiceStatus, StackConfig
from sidecar.dev.local_stack.valkey import LocalValkey

__all__ = [
    "LocalKafka",
    "LocalStack",
    "LocalValkey",
    "ServiceStatus",
    "StackConfig",
    "fetch_kafka_jars",
]
