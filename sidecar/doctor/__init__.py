"""``ragflow-sidecar doctor``: what the deployment the sidecar joins can lose, read from Valkey.

One :class:`~sidecar.doctor.findings.Finding` per line: RAGFlow's Valkey and the state store
(eviction policy and persistence, and what each can lose), RAGFlow's executors in
``rag_flow_svr_task_broker`` and their pending entries, orphaned pending entries (consumers
that no longer heartbeat nor read, with entries in hand), and the group lag RAGFlow shows as
"tasks ahead". ``requeue`` puts orphans back on their stream, once, atomically.

The modules: ``findings`` (the finding and the exit code), ``stores`` (a Valkey's eviction and
persistence), ``executors`` (consumers, liveness, orphans, lag), ``requeue`` (the move).
"""
