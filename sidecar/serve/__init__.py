"""The executed share, sidecar side: the gate, drain-to-redis and the served evidence as metrics."""

from sidecar.serve.drain import DEFAULT_TIMEOUT_S, drain_to_redis, render_drain, render_drain_json
from sidecar.serve.gate import (
    collect,
    parse_baseline,
    parse_next_share,
    parse_window,
    render_table,
)
from sidecar.serve.gate_checks import DECISIONS, ROLLBACK
from sidecar.serve.gate_source import Following, GateSource, OneLook
from sidecar.serve.served_metrics import ServedEvidencePoller, register_served_metrics
from sidecar.serve.share import (
    STORE_WAIT_S,
    describe,
    parse_target,
    read_status,
    render_status,
    set_share,
    while_store_is_down,
)

# The live share.
__all__ = [
    "STORE_WAIT_S",
    "describe",
    "parse_target",
    "read_status",
    "render_status",
    "set_share",
    "while_store_is_down",
]
# The gate and what it reads.
__all__ += [
    "DECISIONS",
    "ROLLBACK",
    "Following",
    "GateSource",
    "OneLook",
    "collect",
    "parse_baseline",
    "parse_next_share",
    "parse_window",
    "render_table",
]
# Drain-to-redis.
__all__ += [
    "DEFAULT_TIMEOUT_S",
    "drain_to_redis",
    "render_drain",
    "render_drain_json",
]
# The served evidence as metrics, in the sidecar.
__all__ += [
    "ServedEvidencePoller",
    "register_served_metrics",
]
