"""The worker observer: RAGFlow's own consumer group, watched read-only."""

from sidecar.observer.observer import RAGFLOW_GROUP, WorkerObserver
from sidecar.observer.reads import COMMANDS_USED
from sidecar.observer.state import WorkerDelivery

__all__ = ["COMMANDS_USED", "RAGFLOW_GROUP", "WorkerDelivery", "WorkerObserver"]
