"""The wire layer: what RAGFlow's processes (``ragflow_mq``) write and the sidecar reads back.

Record headers, the state store's keys and fields (``contract``), the served share's stored
values (``share``) and the evidence's read model (``evidence``). Both packages stand on it, and
it imports nothing of either, so the sidecar never imports ``ragflow_mq`` and what RAGFlow
loads never reaches the sidecar's rooms. Changing a name here is changing a wire format.
"""

from sidecar.wire.contract import (
    DOCUMENT_EVENTS,
    EVENTS,
    LATENCIES,
    PATHS,
    QUEUE_HEADER,
    REDIS_MARKER,
    SERVED_HEADER,
    Keys,
    Path,
)
from sidecar.wire.evidence import Evidence, PathEvidence, histograms, window_keys
from sidecar.wire.share import ShareValues, parse_percent, share_keys

__all__ = [
    "DOCUMENT_EVENTS",
    "EVENTS",
    "LATENCIES",
    "PATHS",
    "QUEUE_HEADER",
    "REDIS_MARKER",
    "SERVED_HEADER",
    "Evidence",
    "Keys",
    "Path",
    "PathEvidence",
    "ShareValues",
    "histograms",
    "parse_percent",
    "share_keys",
    "window_keys",
]
