"""Stage 1: tail RAGFlow's streams in a group of our own and dual-write each entry to Kafka."""
