"""ragflow-kafka-sidecar: move RAGFlow's task queue from Redis Streams to Kafka gradually."""

__version__ = "0.1.0"
