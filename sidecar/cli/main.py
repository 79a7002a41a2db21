"""``ragflow-sidecar``: the command line. The only place that configures logging handlers."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from sidecar.app.service import Sidecar
from sidecar.app.state_store import warn_if_evicting
from sidecar.app.supervisor import run_until_signal
from sidecar.app.wiring import StandaloneMirror
from sidecar.cli import doctor as doctor_cli
from sidecar.cli import rollout as rollout_cli
from sidecar.cli.diffs import render_diffs
from sidecar.cli.reconcile import reconcile, render_json, render_report
from sidecar.cli.roundtrip import round_trip
from sidecar.cli.status import collect_status, render_status
from sidecar.clock import now_ms
from sidecar.config import Settings
from sidecar.errors import SidecarError
from sidecar.serve.drain import DEFAULT_TIMEOUT_S, drain_to_redis, render_drain, render_drain_json
from sidecar.serve.gate import collect, parse_baseline, parse_next_share, parse_window
from sidecar.serve.gate import render_json as render_gate_json
from sidecar.serve.gate import render_table as render_gate_table
from sidecar.serve.gate_checks import ROLLBACK
from sidecar.serve.share import (
    STORE_WAIT_S,
    describe,
    parse_target,
    read_status,
    set_share,
    while_store_is_down,
)
from sidecar.serve.share import render_json as render_share_json
from sidecar.serve.share import render_status as render_share_status
from sidecar.telemetry.health import Health, HealthServer
from sidecar.transport.kafka import KafkaProducer, check_login
from sidecar.transport.topics import init_topics
from sidecar.transport.valkey_client import ping
from sidecar.verdicts.reader import parse_since, read_verdicts
from sidecar.version import __version__

logger = logging.getLogger("sidecar.cli.main")

EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragflow-sidecar",
        description="Mirror RAGFlow's Redis Streams task queue into Kafka and compare both paths.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--config", type=Path, help="RAGFlow service_conf.yaml (redis:, kafka:, mq: sections)"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    commands = parser.add_subparsers(dest="command", required=True)

    _dev_commands(commands)
    topics = commands.add_parser("init-topics", help="create the seed design's Kafka topics")
    topics.add_argument("--replication-factor", type=int, help="default KAFKA_REPLICATION_FACTOR")

    mirror = commands.add_parser(
        "mirror", help="tail RAGFlow's streams and dual-write them to Kafka"
    )
    mirror.add_argument(
        "--compare", action="store_true", help="also record the redis run for the shadow"
    )
    commands.add_parser("run", help="mirror, shadow, observer and verdicts in one process")
    commands.add_parser("shadow", help="shadow-consume Kafka, observe RAGFlow, publish verdicts")
    diffs = commands.add_parser("diffs", help="print verdicts, mismatches as side-by-side diffs")
    diffs.add_argument("--since", help="10m, 2h, 1d, an ISO time or epoch ms")
    diffs.add_argument("--verdict", action="append", help="only this verdict (repeatable)")
    diffs.add_argument("--task-type", action="append", help="only this task type (repeatable)")
    diffs.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    commands.add_parser("status", help="lag, traffic share, verdict and DLQ counts, as a table")
    doctor_cli.add_parser(commands)
    reconcile = commands.add_parser(
        "reconcile", help="account for every stream entry of a window in Kafka; exit 1 if missing"
    )
    reconcile.add_argument("--since", help="entries from: 10m, 2h, 1d, an ISO time or epoch ms")
    reconcile.add_argument("--until", help="entries up to: same forms as --since")
    reconcile.add_argument("--from-id", help="first entry id (ms or ms-seq), instead of --since")
    reconcile.add_argument("--to-id", help="last entry id, instead of --until")
    reconcile.add_argument(
        "--stream", action="append", help="this stream only (repeatable; default MIRROR_STREAMS)"
    )
    reconcile.add_argument(
        "--percent", type=float, help="traffic share in force then (default KAFKA_TRAFFIC_PERCENT)"
    )
    reconcile.add_argument("--json", action="store_true", help="the full report as JSON")
    gate = commands.add_parser(
        "gate",
        help="canary analysis of the served share: exit 0 promote, 1 hold, 3 roll back",
    )
    gate.add_argument("--window", default="30m", help="30m, 2h, 1d, an ISO time or epoch ms")
    gate.add_argument(
        "--baseline",
        help="the watch at 100 %%: the redis path from this time (as --window) until the "
        "window's start; the window's kafka tasks are also tested against it",
    )
    share_help = "the share (%%) a promotion would serve: each margin over it (default 100)"
    gate.add_argument("--next-share", default="100", help=share_help)
    act = gate.add_mutually_exclusive_group()
    act.add_argument("--apply", action="store_true", help="on a roll-back, set the live share to 0")
    act.add_argument(
        "--clear-cap",
        action="store_true",
        help="deprecated: `shift --to` the ceiling (KAFKA_SERVE_PERCENT); no analysis",
    )
    gate.add_argument("--json", action="store_true", help="the report as JSON")
    shift = commands.add_parser(
        "shift",
        help="set the live share RAGFlow serves from Kafka (no restart), or show it",
    )
    to = shift.add_mutually_exclusive_group()
    to.add_argument("--to", help="the live share, 0 to KAFKA_SERVE_PERCENT, decimals allowed")
    to.add_argument(
        "--status",
        action="store_true",
        help="ceiling, live share, served share and the last changes (the default)",
    )
    shift.add_argument("--reason", default="", help="why, kept with the change in its log")
    shift.add_argument(
        "--wait-s",
        type=float,
        default=STORE_WAIT_S,
        help="with --to: how long to wait for a state store that does not answer (RAGFlow "
        "serves 0 meanwhile); 0: fail at once",
    )
    shift.add_argument("--json", action="store_true", help="as JSON")
    rollout_cli.add_parser(commands)
    drain = commands.add_parser(
        "drain-to-redis",
        help="executors stopped: move every unconsumed served record back to its Redis stream",
    )
    drain.add_argument(
        "--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="give up (exit 2) after this"
    )
    drain.add_argument("--json", action="store_true", help="the summary as JSON")
    commands.add_parser("check", help="connect to Valkey and Kafka and print their versions")
    commands.add_parser("roundtrip", help="send a task through each backend and read it back")

    return parser


async def _mirror(settings: Settings) -> int:
    """Run the mirror until SIGTERM/SIGINT; then finish the batch in hand within the grace."""
    return await run_until_signal(
        lambda: StandaloneMirror(settings),
        settings.mirror.shutdown_grace_s,
        "mirror",
        preflight=lambda: check_login(settings.kafka),
    )


async def _sidecar(
    settings: Settings, *, mirror: bool = True, shadow: bool = True, observer: bool = True
) -> int:
    def build(http: HealthServer | None) -> Sidecar:
        return Sidecar(settings, mirror=mirror, shadow=shadow, observer=observer, http=http)

    # Once per process, not per in-process restart: a state store that may evict our keys.
    await warn_if_evicting(settings)

    async def supervise(http: HealthServer | None) -> int:
        return await run_until_signal(
            lambda: build(http),
            settings.mirror.shutdown_grace_s,
            "sidecar",
            preflight=lambda: check_login(settings.kafka),
        )

    if not settings.metrics.port:
        return await supervise(None)
    # One endpoint for the life of the process: between in-process restarts the probes say
    # not ready (and why) and /metrics keeps the last build's series, instead of going silent.
    http = HealthServer(
        settings.metrics.host, settings.metrics.port, Health(("sidecar",)), CollectorRegistry()
    )
    async with http:
        return await supervise(http)


async def _diffs(settings: Settings, args: argparse.Namespace) -> int:
    since = parse_since(args.since, now_ms()) if args.since else None
    records = await read_verdicts(
        settings.kafka,
        since_ms=since,
        verdicts=set(args.verdict) if args.verdict else None,
        task_types=set(args.task_type) if args.task_type else None,
    )
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(render_diffs(records, color=color, width=shutil.get_terminal_size().columns))
    return 0


async def _reconcile(settings: Settings, args: argparse.Namespace) -> int:
    now = now_ms()
    report = await reconcile(
        settings,
        streams=args.stream,
        since_ms=parse_since(args.since, now) if args.since else None,
        until_ms=parse_since(args.until, now) if args.until else None,
        min_id=args.from_id,
        max_id=args.to_id,
        traffic_percent=args.percent,
    )
    print(render_json(report) if args.json else render_report(report))
    return 0 if report.ok else 1


async def _gate(settings: Settings, args: argparse.Namespace) -> int:
    if args.clear_cap:
        print(
            "ragflow-sidecar: note: `gate --clear-cap` is deprecated: it is "
            f"`shift --to {settings.serve.percent:g}` (the ceiling, KAFKA_SERVE_PERCENT)",
            file=sys.stderr,
        )
        ceiling = settings.serve.percent
        done = describe(settings, await set_share(settings, ceiling, by="gate --clear-cap"))
        print(json.dumps({"action": done}) if args.json else done)
        return 0
    now = now_ms()
    since = parse_window(args.window, now)
    baseline = None if args.baseline is None else parse_baseline(args.baseline, now, since)
    next_share = parse_next_share(args.next_share)
    report = await collect(settings, since, now, baseline, next_share=next_share)
    # Only a roll-back acts, and only downwards: promoting is the operator's (`shift --to`).
    if args.apply and report.decision == ROLLBACK:
        shift = await set_share(settings, 0.0, by="gate --apply", reason="; ".join(report.reasons))
        report.action = describe(settings, shift)
    print(render_gate_json(report) if args.json else render_gate_table(report))
    return report.decision


async def _shift(settings: Settings, args: argparse.Namespace) -> int:
    if args.to is not None:
        to = parse_target(args.to, settings.serve.percent)
        shift = await while_store_is_down(
            settings,
            lambda: set_share(settings, to, by="shift", reason=args.reason),
            args.wait_s,
        )
        done = describe(settings, shift)
        print(json.dumps({"action": done}) if args.json else done)
        return 0
    status = await read_status(settings)
    print(render_share_json(status) if args.json else render_share_status(status))
    return 0


async def _drain(settings: Settings, args: argparse.Namespace) -> int:
    report = await drain_to_redis(settings, timeout_s=args.timeout_s)
    print(render_drain_json(report) if args.json else render_drain(report))
    if not report.complete:
        print(
            f"ragflow-sidecar: error: drain-to-redis stopped after {args.timeout_s:g} s short "
            "of the end offsets; run it again to move the rest",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return 0


async def _status(settings: Settings) -> int:
    print(render_status(await collect_status(settings)))
    return 0


async def _check(settings: Settings) -> int:
    version = await ping(settings.redis)
    print(f"valkey  {settings.redis.display_url}  version {version}")
    if settings.state != settings.redis:
        version = await ping(settings.state)
        print(f"state   {settings.state.display_url}  version {version}")
    async with KafkaProducer(settings.kafka):
        print(f"kafka   {','.join(settings.kafka.bootstrap_servers)}  connected")
    return 0


async def _roundtrips(settings: Settings) -> int:
    for backend in ("redis", "kafka"):
        trip = await round_trip(settings, backend)
        verdict = "byte-identical" if trip.identical else "DIFFERENT"
        print(
            f"{trip.backend:6} {trip.destination}: sent {trip.sent_id}, "
            f"read back {trip.received_id} ({verdict}, {trip.elapsed_ms:.0f} ms)"
        )
        if not trip.identical:
            return 1
    return 0


async def _init_topics(settings: Settings, replication_factor: int | None) -> int:
    report = await init_topics(settings.kafka, replication_factor=replication_factor)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


DEV_COMMANDS = ("local-stack", "demo")
NO_DEV_TOOLING = (
    "`{command}` is development tooling: it runs from a checkout of ragflow-kafka-sidecar "
    "(make demo), and this installation (the runtime wheel) does not include sidecar.dev"
)


def _dev_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    try:
        from sidecar.dev.commands import add_commands  # noqa: PLC0415
    except ImportError:
        for name in DEV_COMMANDS:
            bare = commands.add_parser(name, help="(from a checkout only)", add_help=False)
            bare.add_argument("rest", nargs=argparse.REMAINDER)
        return
    add_commands(commands)


def _run_dev_command(args: argparse.Namespace) -> int:
    try:
        from sidecar.dev import commands  # noqa: PLC0415
    except ImportError:
        print(
            f"ragflow-sidecar: error: {NO_DEV_TOOLING.format(command=args.command)}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return commands.local_stack(args) if args.command == "local-stack" else commands.demo(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if logging.getLogger().level > logging.DEBUG:
        # aiokafka logs every failed connection attempt at ERROR; the sidecar reports the
        # outcome once, translated, so its chatter is kept for --log-level DEBUG.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        if args.command in DEV_COMMANDS:
            return _run_dev_command(args)
        settings = Settings.from_env(config_file=args.config)
        # aiokafka reports a refused password as a broker that is down, which would be retried.
        # `shift` and the rollout's controls need only the state store: a roll-back must not
        # wait for Kafka (the autopilot's gate reads Kafka on its own turns); `doctor` reads
        # Valkey alone.
        if args.command not in ("shift", "rollout", "doctor"):
            asyncio.run(check_login(settings.kafka))
        if args.command == "mirror":
            if args.compare:
                return asyncio.run(_sidecar(settings, shadow=False, observer=False))
            return asyncio.run(_mirror(settings))
        if args.command == "run":
            return asyncio.run(_sidecar(settings))
        if args.command == "shadow":
            return asyncio.run(_sidecar(settings, mirror=False))
        if args.command == "diffs":
            return asyncio.run(_diffs(settings, args))
        if args.command == "reconcile":
            return asyncio.run(_reconcile(settings, args))
        if args.command == "gate":
            return asyncio.run(_gate(settings, args))
        if args.command == "shift":
            return asyncio.run(_shift(settings, args))
        if args.command == "rollout":
            return asyncio.run(rollout_cli.run(settings, args))
        if args.command == "drain-to-redis":
            return asyncio.run(_drain(settings, args))
        if args.command == "doctor":
            return doctor_cli.run(settings, args)
        if args.command == "status":
            return asyncio.run(_status(settings))
        if args.command == "check":
            return asyncio.run(_check(settings))
        if args.command == "roundtrip":
            return asyncio.run(_roundtrips(settings))
        if args.command == "init-topics":
            return asyncio.run(_init_topics(settings, args.replication_factor))
    except SidecarError as exc:
        print(f"ragflow-sidecar: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")
