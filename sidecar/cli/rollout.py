"""``ragflow-sidecar rollout run|plan|status|pause|resume|abort``: the autopilot, its forecast
and its controls."""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from typing import Any

from sidecar.app.supervisor import run_until_signal
from sidecar.config import Settings
from sidecar.config.rollout import check_plan
from sidecar.errors import SidecarError
from sidecar.rollout.autopilot import Autopilot
from sidecar.rollout.machine import Decision, RolloutState
from sidecar.rollout.plan import make_plan, plan_settings, render, site_evidence, start_hour_now
from sidecar.rollout.store import RolloutStore
from sidecar.serve.gate_source import read_served
from sidecar.serve.share import STORE_WAIT_S, set_share, while_store_is_down
from sidecar.transport.valkey_client import create_client
from sidecar.wire.contract import EVIDENCE_TTL_S

logger = logging.getLogger(__name__)

STATUS_DECISIONS = 10
# A step's own rate is taken once it ran this long (at a few documents a minute, its first
# minutes say little about the rate).
RATE_AFTER_MIN = 30.0
# As far back as the minute keys go (EVIDENCE_TTL_S, two days): every hour of the day seen
# twice. A longer --since reads the same minutes.
PLAN_SINCE_S = float(EVIDENCE_TTL_S)
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_s(text: str) -> float:
    """``7d``, ``24h``, ``90m``, ``3600s`` (or bare seconds) as seconds, above 0."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number above 0 and s, m, h or d (e.g. 7d, 24h)"
        )
    return float(match[1]) * _UNIT_S[match[2] or "s"]


def add_parser(commands: Any) -> None:
    rollout = commands.add_parser(
        "rollout", help="the autopilot: step the served share through ROLLOUT_STEPS by the gate"
    )
    actions = rollout.add_subparsers(dest="rollout_command", required=True)
    actions.add_parser("run", help="act as the autopilot until SIGTERM (one acts at a time)")
    plan = actions.add_parser(
        "plan", help="how long a rollout takes here: hours to 100 %% (p50, p95), step by step"
    )
    plan.add_argument(
        "--since", type=duration_s, default=PLAN_SINCE_S, metavar="7d",
        help="the site's recent evidence read (default 2d: as long as the minutes are kept)",
    )  # fmt: skip
    plan.add_argument(
        "--within", type=duration_s, default=None, metavar="24h",
        help="also: the margins a rollout can show within this time",
    )  # fmt: skip
    plan.add_argument("--json", action="store_true", help="the plan as JSON")
    status = actions.add_parser("status", help="phase, step, share, and the last decisions")
    status.add_argument("--json", action="store_true", help="the status as JSON")
    actions.add_parser("pause", help="hold the share where it is until `resume`")
    actions.add_parser("resume", help="go on (from the plan's first step after a roll-back)")
    abort = actions.add_parser("abort", help="the served share to 0 now; the autopilot stops there")
    abort.add_argument(
        "--wait-s",
        type=float,
        default=STORE_WAIT_S,
        help="how long to wait for a state store that does not answer (RAGFlow serves 0 "
        "meanwhile); 0: fail at once",
    )


async def run(settings: Settings, args: argparse.Namespace) -> int:
    order = args.rollout_command
    if order == "plan":
        planned = await read_plan(settings, args.since, args.within)
        print(
            json.dumps(planned, indent=2) if args.json else render(planned, plan_settings(settings))
        )
        return 0
    if order == "run":
        check_plan(settings.rollout, settings.serve.percent)  # refused before any plan is read
        await _plan_at_start(settings)
        return await run_until_signal(
            lambda: Autopilot(settings), settings.mirror.shutdown_grace_s, "rollout"
        )
    client = create_client(settings.state)
    store = RolloutStore(client, settings.serve.key_prefix, settings.state.display_url)
    try:
        if order == "status":
            print(await _status(store, as_json=args.json))
            return 0
        if order == "abort":
            # The share at once, whether an autopilot runs or not: it records the abort when it
            # next acts. Through a state-store outage RAGFlow serves 0 by itself; this waits
            # for the store (an abort queued twice is harmless).
            async def abort() -> None:
                await store.order(order)
                await set_share(settings, 0.0, by="rollout abort", reason="aborted by an operator")

            await while_store_is_down(settings, abort, args.wait_s)
            print("rollout abort: the served share is 0 now; the autopilot stops there")
        else:
            await store.order(order)
            print(f"rollout {order}: queued; the autopilot acts on it within its next turn")
        return 0
    finally:
        await client.aclose()


async def read_plan(
    settings: Settings, since_s: float, within_s: float | None, now_s: float | None = None
) -> dict[str, Any]:
    """The site's minutes since ``since_s`` ago, from the state store, as a plan."""
    now_s = time.time() if now_s is None else now_s
    minutes, _ = await read_served(settings, now_s - since_s, now_s)
    site = site_evidence(minutes, int((now_s - since_s) // 60), settings.gate.latency_floor_ms)
    if site.documents_per_min <= 0:
        raise SidecarError(
            f"no finished documents in the last {since_s / 3600:g} h under the key prefix "
            f"{settings.serve.key_prefix!r}: nothing to forecast from (RAGFlow's processes "
            "record evidence once ragflow_mq is installed)"
        )
    within_hours = within_s / 3600 if within_s is not None else None
    return make_plan(site, plan_settings(settings), within_hours, start_hour_now())


async def _plan_at_start(settings: Settings) -> None:
    """The plan, printed and kept for ``rollout status``; a plan that cannot be made (no
    evidence yet, a store down) never keeps the autopilot from starting."""
    try:
        planned = await read_plan(settings, PLAN_SINCE_S, None)
    except SidecarError as exc:
        logger.warning("rollout: no plan (%s)", exc)
        return
    print(render(planned, plan_settings(settings)), flush=True)
    client = create_client(settings.state)
    try:
        store = RolloutStore(client, settings.serve.key_prefix, settings.state.display_url)
        await store.save_plan(json.dumps(planned))
    except SidecarError as exc:
        logger.warning("rollout: the plan was not kept for `rollout status` (%s)", exc)
    finally:
        await client.aclose()


async def _status(store: RolloutStore, *, as_json: bool) -> str:
    state = await store.load()
    decisions = await store.decisions(STATUS_DECISIONS)
    holder = await store.lease_holder()
    raw_plan = await store.load_plan()
    planned = json.loads(raw_plan) if raw_plan else None
    if as_json:
        return json.dumps(
            {
                "state": json.loads(state.to_json()) if state else None,
                "autopilot": holder,
                "decisions": [d.to_fields() for d in decisions],
                "plan": planned,
            },
            indent=2,
            sort_keys=True,
        )
    return render_status(state, decisions, holder, planned)


def render_status(
    state: RolloutState | None,
    decisions: list[Decision],
    holder: str | None,
    planned: dict[str, Any] | None = None,
) -> str:
    if state is None:
        return "rollout: never started (`ragflow-sidecar rollout run` starts it)"
    lines = [
        f"rollout: {state.phase}, served share {state.share:g} %"
        + (f", step {state.step + 1}" if state.step >= 0 else ""),
        f"autopilot: {holder or 'none acting'}",
        f"this step since: {_time(state.step_since_ms)}; the rollout since: "
        f"{_time(state.started_ms)}",
    ]
    if planned is not None:
        lines += ["", "steps (Kafka's documents, against the plan at the rollout's start):"]
        lines += step_lines(state, decisions, planned)
    lines += [
        "",
        "decisions (oldest first):",
    ]
    lines += [
        f"  {_time(d.at_ms)}  {d.action:<8} {d.share_from:g} -> {d.share_to:g} %  {d.reason}"
        for d in decisions
    ]
    return "\n".join(lines)


def step_lines(
    state: RolloutState,
    decisions: list[Decision],
    planned: dict[str, Any],
    now_ms: int | None = None,
) -> list[str]:
    """Each step: done, or N of about M documents and about H hours more at the current rate:
    Kafka's in this step so far once it ran ``RATE_AFTER_MIN``, the plan's before."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    last = decisions[-1].evidence if decisions else {}
    now = int(last.get("kafka_documents", 0))
    rate = float(planned["documents_per_min"])
    ran_min = (now_ms - state.step_since_ms) / 60_000 if state.step_since_ms else 0.0
    lines = []
    for index, step in enumerate(planned["steps"]):
        wanted, share = int(step["kafka_documents"]), float(step["share"])
        if index < state.step or (index == state.step and state.phase == "watching"):
            told = "done"
        elif index == state.step and state.phase == "ramping":
            per_min = now / ran_min if now and ran_min >= RATE_AFTER_MIN else rate * share / 100
            left_min = max(wanted - now, 0) / per_min if per_min > 0 else 0.0
            told = (
                f"{now} of about {wanted} documents, about {left_min / 60:.1f} hours more "
                "at the current rate"
            )
        else:
            told = f"about {wanted} documents"
        lines.append(f"  {share:>5g} %  {told}")
    return lines


def _time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"
