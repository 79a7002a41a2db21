"""``reconcile`` against real Valkey and Kafka: it finds what is missing, doubled and reordered."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import valkey.asyncio as avalkey

from sidecar.app.wiring import running_mirror
from sidecar.cli.reconcile import reconcile, render_report
from sidecar.config import Settings
from sidecar.config.routing import RouteTable
from sidecar.config.traffic import in_traffic_share
from sidecar.transport import KafkaProducer
from sidecar.transport.base import OutgoingMessage
from sidecar.transport.topics import PARSE_TOPIC, init_topics
from tests.mirror_support import mirror_settings, mirror_until, ragflow_tasks

pytestmark = pytest.mark.kafka39

BROKEN = [
    {"message": b"{not json"},
    {"other": b"no message field"},
    {"message": json.dumps({"doc_id": "d", "task_type": "parse"}).encode()},  # no id
]


def run_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{
            k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "MIRROR_", "REDIS_"))
        },
        "REDIS_URL": f"redis://{settings.redis.host}:{settings.redis.port}/1",
        "KAFKA_BOOTSTRAP_SERVERS": ",".join(settings.kafka.bootstrap_servers),
        "MIRROR_STREAMS": ",".join(settings.mirror.streams),
        "KAFKA_TRAFFIC_PERCENT": str(settings.mirror.traffic_percent),
    }
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "reconcile", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_a_mirrored_window_is_whole_and_later_entries_are_missing(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    s = mirror_settings(settings, [unique], KAFKA_TRAFFIC_PERCENT="50")
    tasks = ragflow_tasks(200)
    for task in tasks:
        await valkey_client.xadd(unique, {"message": json.dumps(task)})
    for fields in BROKEN:
        await valkey_client.xadd(unique, fields)
    async with running_mirror(s) as mirror:
        await mirror_until(mirror, len(tasks) + len(BROKEN))
    routes = RouteTable()
    in_share = sum(in_traffic_share(routes.route(t, 0).key, 50) for t in tasks)
    assert 0 < in_share < len(tasks)  # the share really splits this sample

    report = await reconcile(s)
    row = report.streams[unique]
    print("\n" + render_report(report))
    assert report.ok
    assert (row.written, row.in_share, row.outside_share) == (203, in_share, 200 - in_share)
    assert (row.undecodable, row.dead_lettered) == (3, 3)
    assert row.found == row.expected == in_share + 3
    assert row.in_task_topics == in_share
    assert (row.missing, row.duplicated, row.unexpected, row.order_violations) == ([], {}, 0, [])

    # Entries the mirror never saw: in the share, so missing; the window before them is whole.
    last_mirrored = (await valkey_client.xrevrange(unique, count=1))[0][0].decode()
    late = [t for t in ragflow_tasks(40) if in_traffic_share(routes.route(t, 0).key, 50)]
    late_ids = [
        (await valkey_client.xadd(unique, {"message": json.dumps(t)})).decode() for t in late
    ]
    failed = run_cli(s, "--json")
    assert failed.returncode == 1, failed.stderr
    body = json.loads(failed.stdout)
    assert body["ok"] is False
    assert body["streams"][unique]["missing"] == late_ids

    whole = run_cli(s, "--to-id", last_mirrored)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "OK: nothing missing" in whole.stdout

    tail = run_cli(s, "--from-id", late_ids[0])
    assert tail.returncode == 1
    assert f"NOT OK: {len(late_ids)} entries missing" in tail.stdout
    assert late_ids[0] in tail.stdout


async def test_duplicates_and_per_key_reordering_are_counted(
    settings: Settings, valkey_client: avalkey.Valkey, unique: str
) -> None:
    await init_topics(settings.kafka)
    s = mirror_settings(settings, [unique])
    ids = [
        (await valkey_client.xadd(unique, {"message": json.dumps(t)})).decode()
        for t in ragflow_tasks(3)
    ]

    def record(entry_id: str) -> OutgoingMessage:
        headers = [("x-redis-stream", unique.encode()), ("x-redis-id", entry_id.encode())]
        return OutgoingMessage(PARSE_TOPIC, b"{}", key=f"{unique}-doc", headers=headers)

    # One document's entries written as 0, 2, 1, 2: entry 1 after 2 is out of order, and
    # entry 2 is there twice.
    async with KafkaProducer(s.kafka) as producer:
        await producer.send_many([record(ids[0]), record(ids[2]), record(ids[1]), record(ids[2])])

    report = await reconcile(s)
    row = report.streams[unique]
    assert report.ok  # nothing is missing
    assert row.duplicated == {ids[2]: 2}
    assert row.extra_records == 1
    assert [(v.earlier, v.later) for v in row.order_violations] == [(ids[1], ids[2])]
    assert ids[1] in render_report(report)


async def test_bad_windows_are_refused_with_the_option_named(settings: Settings) -> None:
    both = run_cli(mirror_settings(settings, ["x"]), "--since", "10m", "--from-id", "1-0")
    assert both.returncode == 2
    assert "--from-id" in both.stderr
    bad = run_cli(mirror_settings(settings, ["x"]), "--to-id", "yesterday")
    assert bad.returncode == 2
    assert "--to-id" in bad.stderr
