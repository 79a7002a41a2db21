"""``ragflow-sidecar doctor``: what the deployment the sidecar joins can lose, read from Valkey.

One :class:`~sidecar.doctor.findings.Finding` per line: RAGFlow's Valkey and the state store
(eviction policy and persistence, and what each can lose), RAGFlow's executors in
``rag_flow_svr_task_broker`` and their pending entries, orphaned pending entries (consumers
that no longer heartbeat nor read, with entries in hand), and the group lag RAGFlow shows as
"tasks ahead". ``requeue`` puts orphans back on their stream, once, atomically.

The modules: ``findings`` (the finding and the exit code), ``stores`` (a Valkey's eviction and
persistence), ``executors`` (consumers, liveness, orphans, lag), ``requeue`` (the move).
"""

from sidecar.doctor.collect import read_executors, read_stores
from sidecar.doctor.executors import DEFAULT_OLDER_THAN
from sidecar.doctor.findings import exit_code, render
from sidecar.doctor.poller import DoctorPoller, register_doctor_metrics
from sidecar.doctor.requeue import REQUEUED_KEY, requeue_orphans

# The command: read, render, exit code.
__all__ = [
    "DEFAULT_OLDER_THAN",
    "exit_code",
    "read_executors",
    "read_stores",
    "render",
]
# Requeueing orphans.
__all__ += [
    "REQUEUED_KEY",
    "requeue_orphans",
]
# The findings as metrics, in the sidecar.
__all__ += [
    "DoctorPoller",
    "register_doctor_metrics",
]
