"""Settings of the autopilot (``ragflow-sidecar rollout``): its plan of steps and its pace.

Part of :class:`~sidecar.config.Settings`, read by the same reader. The plan is checked against
the ceiling (``KAFKA_SERVE_PERCENT``) only when the autopilot starts (:func:`check_plan`): a
deployment that never runs it must not fail on a plan it does not use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sidecar.config.env import Reader, Table, Var, choice, integer, number
from sidecar.errors import ConfigError

OnRollback = Literal["zero", "last_good"]
ON_ROLLBACK: tuple[str, ...] = ("zero", "last_good")
# No 1 % step: a broken path harms the documents the harm tests need to see it, a handful,
# whatever the share; a smaller share only makes them arrive later (at 5 documents a minute a
# 1 % step waited 17 hours for 50 Kafka documents).
DEFAULT_STEPS: tuple[float, ...] = (5.0, 25.0, 50.0, 100.0)


@dataclass(frozen=True)
class RolloutSettings:
    """A plan of served shares, each held at least ``dwell_s`` and until each path has
    finished ``min_documents`` documents in it, the gate asked every ``interval_s``."""

    steps: tuple[float, ...] = DEFAULT_STEPS
    dwell_s: float = 600.0
    # A floor under the margins (which ask as many documents as their evidence needs): a step
    # promoted on a handful of documents would rest on the harm tests' silence.
    min_documents: int = 20
    interval_s: float = 60.0
    on_rollback: OnRollback = "zero"  # or back to the last step promoted from
    lease_s: float = 30.0  # one autopilot acts; another takes over this long after it died
    # Documents kept on Redis while the last step (100 %) is watched: a concurrent control, so
    # that the watch compares like with like (a drifting mix, a batch of scanned PDFs, moves
    # both paths) instead of a baseline from before (bench/gate_defaults.py has the numbers).
    holdback_percent: float = 5.0

    def share_of(self, step: int) -> float:
        """The share step ``step`` serves: the plan's, less the hold-back at 100 %."""
        return min(self.steps[step], 100.0 - self.holdback_percent)


def _steps(reader: Reader, name: str, default: Any, _: Mapping[str, Any]) -> tuple[float, ...]:
    text = reader.text(name, None)
    if text is None:
        return tuple(default)
    steps: list[float] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            step = float(item)
        except ValueError:
            raise reader.error(name, f"step {item!r} is not a percentage") from None
        if not 0.0 < step <= 100.0:  # also rejects NaN
            raise reader.error(name, f"step {item} is out of range (must be above 0, up to 100)")
        if steps and step <= steps[-1]:
            raise reader.error(name, f"steps must rise: {item} comes after {steps[-1]:g}")
        steps.append(step)
    if not steps:
        raise reader.error(name, "no step")
    return tuple(steps)


ROLLOUT = Table(
    RolloutSettings,
    Var("ROLLOUT_STEPS", "steps", _steps),
    Var("ROLLOUT_DWELL_S", "dwell_s", number(0.0, 30 * 86400.0)),
    Var("ROLLOUT_MIN_DOCUMENTS", "min_documents", integer(1)),
    Var("ROLLOUT_INTERVAL_S", "interval_s", number(0.1, 3600.0)),
    Var("ROLLOUT_ON_ROLLBACK", "on_rollback", choice(ON_ROLLBACK)),
    Var("ROLLOUT_LEASE_S", "lease_s", number(1.0, 3600.0)),
    Var("ROLLOUT_HOLDBACK_PERCENT", "holdback_percent", number(0.0, 50.0)),
)
ROLLOUT_VARIABLES: tuple[str, ...] = ROLLOUT.names


def build_rollout(reader: Reader) -> RolloutSettings:
    return ROLLOUT.build(reader)


def check_plan(rollout: RolloutSettings, ceiling: float) -> None:
    """Refuse a plan that climbs above the ceiling the operator set (``KAFKA_SERVE_PERCENT``)."""
    above = [step for step in rollout.steps if step > ceiling]
    if above:
        raise ConfigError(
            "ROLLOUT_STEPS",
            f"{', '.join(f'{s:g}' for s in above)} above the ceiling KAFKA_SERVE_PERCENT="
            f"{ceiling:g}: raise the ceiling in the sidecar's and RAGFlow's environment, or "
            "end the plan below it",
        )
