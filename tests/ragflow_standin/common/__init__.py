"""Stand-in of RAGFlow's ``common`` package: only what its task queue needs (written by us)."""
