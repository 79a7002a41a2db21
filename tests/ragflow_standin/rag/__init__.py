"""Stand-in of RAGFlow's ``rag`` package: its task queue and executor loop, written by us."""
