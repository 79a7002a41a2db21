"""Stage 1: tail RAGFlow's streams in a group of our own and dual-write each entry to Kafka."""

from sidecar.mirror.mirror import AfterProduce, Mirror, RecordTransform
from sidecar.mirror.records import MAX_REQUEST_BYTES

# The stage.
__all__ = [
    "Mirror",
]
# What the composition root plugs into it.
__all__ += [
    "MAX_REQUEST_BYTES",
    "AfterProduce",
    "RecordTransform",
]
