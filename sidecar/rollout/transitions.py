"""The autopilot's vocabulary and its one table of transitions.

Each ``Literal`` below is the only place its names are written; the tuples are derived from it.
:data:`TRANSITIONS` lists every move the autopilot can make: from which phases, on which
trigger, to which phase, under which action, and when it applies. :mod:`.machine` names the
trigger and asks :func:`transition` for the row, so a move the table lacks raises instead of
happening; docs/operations.md shows the table (``python -m tools.rollout_table`` writes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

Phase = Literal["ramping", "watching", "paused", "rolled_back", "aborted"]
PHASES: Final[tuple[Phase, ...]] = get_args(Phase)
Action = Literal["start", "promote", "hold", "rollback", "pause", "resume", "abort"]
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)
Command = Literal["pause", "resume", "abort"]
COMMANDS: Final[tuple[Command, ...]] = get_args(Command)
GateDecision = Literal["promote", "hold", "rollback"]

# The phases that never move on their own: only an operator's order takes them on.
STOPPED: Final[tuple[Phase, ...]] = ("paused", "rolled_back", "aborted")

Trigger = Literal[
    # A turn: the autopilot's periodic look at the gate (machine.decide).
    "awaiting_resume",
    "first_turn",
    "gate_unread",
    "gate_rolls_back",
    "watch_goes_on",
    "dwell_left",
    "documents_short",
    "gate_holds",
    "last_step_passes",
    "gate_promotes",
    # An operator's order (machine.command).
    "abort",
    "pause",
    "already_paused",
    "resume_ramping",
    "resume_watching",
    "resume_over",
    "not_paused",
]
TRIGGERS: Final[tuple[Trigger, ...]] = get_args(Trigger)


@dataclass(frozen=True)
class Transition:
    """One row: in a phase of ``source``, ``trigger`` takes the rollout to ``target`` (``None``:
    it stays in the phase it is in) and is recorded as ``action``; ``when`` says when it
    applies, for the docs and for the reader."""

    source: tuple[Phase, ...]
    trigger: Trigger
    target: Phase | None
    action: Action
    when: str


TRANSITIONS: Final[tuple[Transition, ...]] = (
    # --- turns, in the order machine.decide tries them ---
    Transition(
        STOPPED, "awaiting_resume", None, "hold",
        "Any turn while stopped: nothing moves by itself until `rollout resume`.",
    ),
    Transition(
        ("ramping",), "first_turn", "ramping", "start",
        "The first turn of a rollout: the plan's first step goes into force.",
    ),
    Transition(
        ("ramping", "watching"), "gate_unread", None, "hold",
        "A turn on which the gate was not asked: nothing to judge by.",
    ),
    Transition(
        ("ramping", "watching"), "gate_rolls_back", "rolled_back", "rollback",
        "The gate rolls back: the share goes to 0 (or the last good step) and stays there.",
    ),
    Transition(
        ("watching",), "watch_goes_on", None, "hold",
        "Watching the last step and the gate does not roll back: keep watching.",
    ),
    Transition(
        ("ramping",), "dwell_left", None, "hold",
        "The step's dwell is not over yet.",
    ),
    Transition(
        ("ramping",), "documents_short", None, "hold",
        "A path has finished fewer documents in the step than the plan's minimum.",
    ),
    Transition(
        ("ramping",), "gate_holds", None, "hold",
        "Dwell and documents are in, but the gate holds: not yet evidence enough.",
    ),
    Transition(
        ("ramping",), "last_step_passes", "watching", "promote",
        "The plan's last step passes the gate: the share stays, the gate keeps judging it.",
    ),
    Transition(
        ("ramping",), "gate_promotes", "ramping", "promote",
        "A step before the last passes the gate: the plan's next step goes into force.",
    ),
    # --- operators' orders ---
    Transition(
        PHASES, "abort", "aborted", "abort",
        "`rollout abort`, in any phase: the share goes to 0 at once.",
    ),
    Transition(
        ("ramping", "watching", "rolled_back", "aborted"), "pause", "paused", "pause",
        "`rollout pause`: the share stays where it is, nothing is promoted or rolled back.",
    ),
    Transition(
        ("paused",), "already_paused", None, "hold",
        "`rollout pause` while paused: nothing changes.",
    ),
    Transition(
        ("paused",), "resume_ramping", "ramping", "resume",
        "`rollout resume` of a pause taken while ramping: the step goes on, its dwell anew.",
    ),
    Transition(
        ("paused",), "resume_watching", "watching", "resume",
        "`rollout resume` of a pause taken while watching: the watch goes on.",
    ),
    Transition(
        STOPPED, "resume_over", "ramping", "resume",
        "`rollout resume` after a roll-back or an abort (paused or not): a new rollout from "
        "the plan's first step.",
    ),
    Transition(
        ("ramping", "watching"), "not_paused", None, "hold",
        "`rollout resume` while ramping or watching: nothing to resume.",
    ),
)  # fmt: skip

_BY_TRIGGER: Final[dict[Trigger, Transition]] = {row.trigger: row for row in TRANSITIONS}


def transition(phase: Phase, trigger: Trigger) -> Transition:
    """The table's row for ``trigger`` in ``phase``; a move the table does not list raises."""
    row = _BY_TRIGGER[trigger]
    if phase not in row.source:
        raise ValueError(
            f"rollout: no transition {trigger!r} from phase {phase!r} "
            f"(it applies in {', '.join(row.source)})"
        )
    return row
