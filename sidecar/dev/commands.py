"""``ragflow-sidecar local-stack`` and ``demo``: development tooling, present in a checkout only.

The runtime wheel leaves ``sidecar.dev`` out; :mod:`sidecar.cli.main` says so when these
commands are asked for there.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from sidecar.dev.demo import run_demo
from sidecar.dev.local_stack import LocalStack, StackConfig


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``local-stack`` and ``demo`` subcommands with their options."""
    stack = commands.add_parser("local-stack", help="real Valkey and Kafka on 127.0.0.1")
    stack.add_argument("action", choices=("up", "down", "status"))
    stack_options(stack)
    stack.add_argument(
        "--brokers",
        type=int,
        choices=(1, 3),
        default=StackConfig().kafka_brokers,
        help="3: a KRaft cluster of three combined broker+controller nodes (ports +10, +20)",
    )

    demo = commands.add_parser(
        "demo", help="local stack up, topics, the whole sidecar over a RAGFlow-like load, down"
    )
    stack_options(demo)
    demo.add_argument("--tasks", type=int, default=2000, help="RAGFlow tasks to enqueue")
    demo.add_argument(
        "--inject-faults", action="store_true", help="change, drop or double some Kafka copies"
    )


def stack_options(parser: argparse.ArgumentParser) -> None:
    defaults = StackConfig()
    parser.add_argument("--dir", type=Path, default=defaults.root, help="data and logs")
    parser.add_argument("--valkey-port", type=int, default=defaults.valkey_port)
    parser.add_argument("--kafka-port", type=int, default=defaults.kafka_port)
    parser.add_argument("--kafka-controller-port", type=int, default=defaults.kafka_controller_port)
    parser.add_argument("--aof", action="store_true", help="Valkey with AOF persistence")
    parser.add_argument(
        "--secured", action="store_true", help="also a SASL_SSL (SCRAM-SHA-512) Kafka listener"
    )
    parser.add_argument("--kafka-sasl-ssl-port", type=int, default=defaults.kafka_sasl_ssl_port)
    parser.add_argument(
        "--jaeger",
        action="store_true",
        help="also a Jaeger receiving the sidecar's traces (built by `make jaeger`)",
    )
    parser.add_argument("--jaeger-otlp-port", type=int, default=defaults.jaeger_otlp_port)
    parser.add_argument("--jaeger-query-port", type=int, default=defaults.jaeger_query_port)
    parser.add_argument(
        "--kafka-version",
        default=defaults.kafka_version,
        help="Apache Kafka release to fetch and run, 3.9.x or 4.x (default %(default)s)",
    )


def _stack(args: argparse.Namespace) -> LocalStack:
    return LocalStack(
        StackConfig(
            root=args.dir,
            valkey_port=args.valkey_port,
            kafka_port=args.kafka_port,
            kafka_controller_port=args.kafka_controller_port,
            valkey_aof=args.aof,
            kafka_secured=args.secured,
            kafka_sasl_ssl_port=args.kafka_sasl_ssl_port,
            kafka_version=args.kafka_version,
            # The demo runs on the single broker; only `local-stack up` offers the cluster.
            kafka_brokers=getattr(args, "brokers", 1),
            jaeger=args.jaeger,
            jaeger_otlp_port=args.jaeger_otlp_port,
            jaeger_query_port=args.jaeger_query_port,
        )
    )


def local_stack(args: argparse.Namespace) -> int:
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


def demo(args: argparse.Namespace) -> int:
    stack = _stack(args)
    already_running = all(service.answering for service in stack.status())
    print("starting the local stack (first run fetches Kafka's jars)...", flush=True)
    stack.up()
    print(stack.exports(), end="")
    try:
        print(f"valkey {stack.valkey.version()}, kafka {stack.kafka.running_version()}")
        return asyncio.run(run_demo(stack, args.tasks, inject_faults=args.inject_faults))
    finally:
        if not already_running:
            print(f"stopped {', '.join(stack.down())}")
