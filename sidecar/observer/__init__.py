"""The primary observer: RAGFlow's own consumer group, watched read-only."""

from sidecar.observer.observer import RAGFLOW_GROUP, PrimaryObserver
from sidecar.observer.reads import COMMANDS_USED
from sidecar.observer.state import PrimaryDelivery

__all__ = ["COMMANDS_USED", "RAGFLOW_GROUP", "PrimaryDelivery", "PrimaryObserver"]
