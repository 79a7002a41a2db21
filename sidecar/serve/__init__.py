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
from sidecar.serve.gate_source import Following, GateSource, OneLook, read_served
from sidecar.serve.gate_tests import MARGIN_TESTS, SAMPLED, margin_of
from sidecar.serve.margins import RHO_FRACTION, crossing, margin_at, strata, weighed
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
# The margins, as the rollout's forecast models them on the gate's own functions.
__all__ += [
    "MARGIN_TESTS",
    "RHO_FRACTION",
    "SAMPLED",
    "crossing",
    "margin_at",
    "margin_of",
    "read_served",
    "strata",
    "weighed",
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
