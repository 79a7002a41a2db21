"""Stage 2: the handler run on the Kafka copy (shadow consumer) and on the Redis copy (replay)."""
