"""The autopilot: a plan of served shares, stepped through by the gate's decisions."""

from sidecar.rollout.autopilot import Autopilot
from sidecar.rollout.machine import Decision, RolloutState
from sidecar.rollout.plan import make_plan, plan_settings, render, site_evidence, start_hour_now
from sidecar.rollout.rollout_metrics import RolloutPoller, register_rollout_metrics
from sidecar.rollout.store import RolloutStore

# The autopilot and its record.
__all__ = [
    "Autopilot",
    "Decision",
    "RolloutState",
    "RolloutStore",
]
# Its metrics, read by the sidecar.
__all__ += [
    "RolloutPoller",
    "register_rollout_metrics",
]
# Its plan: how long a rollout takes at a site's rate (``rollout plan``).
__all__ += [
    "make_plan",
    "plan_settings",
    "render",
    "site_evidence",
    "start_hour_now",
]
