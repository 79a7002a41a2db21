"""``ragflow-sidecar``: the command line. The only place that configures logging handlers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar import __version__
from sidecar.demo import run_demo
from sidecar.errors import SidecarError
from sidecar.local_stack import LocalStack, StackConfig
from sidecar.mirror import Mirror
from sidecar.mq.kafka import KafkaProducer
from sidecar.mq.redis_streams import ping
from sidecar.roundtrip import round_trip
from sidecar.settings import Settings
from sidecar.topics import init_topics

logger = logging.getLogger("sidecar.cli")

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

    stack = commands.add_parser("local-stack", help="real Valkey and Kafka on 127.0.0.1")
    stack.add_argument("action", choices=("up", "down", "status"))
    _stack_options(stack)

    topics = commands.add_parser("init-topics", help="create the seed design's Kafka topics")
    topics.add_argument("--replication-factor", type=int, help="default KAFKA_REPLICATION_FACTOR")

    commands.add_parser("mirror", help="tail RAGFlow's streams and dual-write them to Kafka")
    commands.add_parser("check", help="connect to Valkey and Kafka and print their versions")
    commands.add_parser("roundtrip", help="send a task through each backend and read it back")

    demo = commands.add_parser(
        "demo", help="local stack up, topics, mirror RAGFlow-shaped tasks, stack down"
    )
    _stack_options(demo)
    return parser


def _stack_options(parser: argparse.ArgumentParser) -> None:
    defaults = StackConfig()
    parser.add_argument("--dir", type=Path, default=defaults.root, help="data and logs")
    parser.add_argument("--valkey-port", type=int, default=defaults.valkey_port)
    parser.add_argument("--kafka-port", type=int, default=defaults.kafka_port)
    parser.add_argument("--kafka-controller-port", type=int, default=defaults.kafka_controller_port)
    parser.add_argument("--aof", action="store_true", help="Valkey with AOF persistence")


def _stack(args: argparse.Namespace) -> LocalStack:
    return LocalStack(
        StackConfig(
            root=args.dir,
            valkey_port=args.valkey_port,
            kafka_port=args.kafka_port,
            kafka_controller_port=args.kafka_controller_port,
            valkey_aof=args.aof,
        )
    )


def _local_stack(args: argparse.Namespace) -> int:
    if args.action == "up":
        stack = _stack(args)
        stack.up()
        print(stack.exports(), end="")
        return 0
    # down/status act on what the last `up` in that directory started, whatever the flags say.
    stack = LocalStack.from_state(args.dir)
    if args.action == "down":
        stopped = stack.down()
        print(f"stopped {', '.join(stopped)}" if stopped else "nothing was running")
        return 0
    healthy = True
    for service in stack.status():
        state = "running" if service.pid else "stopped"
        answer = "answering" if service.answering else "not answering"
        print(
            f"{service.name:7} {state:8} pid={service.pid or '-':<8} {answer:14} {service.address}"
        )
        healthy = healthy and service.answering
    return 0 if healthy else 1


async def _mirror(settings: Settings) -> int:
    """Run the mirror until SIGTERM/SIGINT; then finish the batch in hand within the grace."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    grace_s = settings.mirror.shutdown_grace_s
    async with Mirror(settings) as mirror:
        running = asyncio.create_task(mirror.run(stop), name="mirror")
        stopping = asyncio.create_task(stop.wait(), name="mirror-stop-signal")
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not running.done():
            logger.info("stop requested; finishing the current batch (grace %.0f s)", grace_s)
            try:
                await asyncio.wait_for(running, timeout=grace_s)
            except TimeoutError:
                logger.warning("grace period over; unacked entries will be replayed on restart")
        else:
            running.result()  # a crashed loop raises here
    return 0


async def _check(settings: Settings) -> int:
    version = await ping(settings.redis)
    print(f"valkey  {settings.redis.display_url}  version {version}")
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


def _demo(args: argparse.Namespace) -> int:
    stack = _stack(args)
    already_running = all(service.answering for service in stack.status())
    print("starting the local stack (first run fetches Kafka's jars)...", flush=True)
    stack.up()
    print(stack.exports(), end="")
    try:
        print(f"valkey {stack.valkey.version()}, kafka {stack.kafka.running_version()}")
        return asyncio.run(run_demo(stack))
    finally:
        if not already_running:
            print(f"stopped {', '.join(stack.down())}")


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
        if args.command == "local-stack":
            return _local_stack(args)
        if args.command == "demo":
            return _demo(args)
        settings = Settings.from_env(config_file=args.config)
        if args.command == "mirror":
            return asyncio.run(_mirror(settings))
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
