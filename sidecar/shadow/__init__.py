"""Stage 2: the handler run on the Kafka copy (shadow consumer) and on the Redis copy (replay)."""

from sidecar.shadow.handlers import NamedHandler, load_handler
from sidecar.shadow.replay import RedisRunRecorder
from sidecar.shadow.shadow import MAX_DLQ_BYTES, ShadowConsumer

# The stage: the shadow consumer and the replay's recorder.
__all__ = [
    "MAX_DLQ_BYTES",
    "RedisRunRecorder",
    "ShadowConsumer",
]
# The handler both paths run.
__all__ += [
    "NamedHandler",
    "load_handler",
]
