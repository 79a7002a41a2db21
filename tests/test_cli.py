"""The command line: bad configuration gives one clear error line and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.dev.local_stack import LocalStack


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "REDIS_", "MQ_"))}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_one_clear_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ragflow-sidecar: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"REDIS_URL": "mysql://localhost/1"}, ("REDIS_URL", "unsupported scheme 'mysql'")),
        ({"KAFKA_DEFAULT_PARTITIONS": "four"}, ("KAFKA_DEFAULT_PARTITIONS", "'four'")),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KAFKA_SASL_USERNAME": "sidecar"},
            ("KAFKA_SASL_PASSWORD", "required when KAFKA_SECURITY_PROTOCOL=SASL_SSL"),
        ),
    ],
)
def test_bad_configuration(env: dict[str, str], fragments: tuple[str, ...]) -> None:
    assert_one_clear_error(run_cli("check", env=env), *fragments)


def test_unreachable_broker(stack: LocalStack) -> None:
    env = {
        "REDIS_URL": stack.valkey.url,
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "KAFKA_SASL_PASSWORD": "never-print-me",
    }
    result = run_cli("init-topics", env=env)
    assert_one_clear_error(result, "cannot reach Kafka at 127.0.0.1:1")
    assert "never-print-me" not in result.stderr + result.stdout


def test_unreachable_valkey_hides_its_password() -> None:
    result = run_cli("check", env={"REDIS_URL": "redis://:hunter2-secret@127.0.0.1:1/1"})
    assert_one_clear_error(result, "cannot reach Valkey at redis://:***@127.0.0.1:1/1")
    assert "hunter2-secret" not in result.stderr + result.stdout


def test_bad_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "service_conf.yaml"
    conf.write_text("mq:\n  backend: '${MQ_BACKEND:-zeromq}'\n")
    assert_one_clear_error(
        run_cli("--config", str(conf), "check"), "MQ_BACKEND (service_conf.yaml mq.backend)"
    )


def test_check_and_roundtrip_against_the_real_stack(stack: LocalStack) -> None:
    env = {"REDIS_URL": stack.valkey.url, "KAFKA_BOOTSTRAP_SERVERS": stack.kafka.bootstrap_servers}
    check = run_cli("check", env=env)
    assert check.returncode == 0, check.stderr
    assert f"version {stack.valkey.version()}" in check.stdout
    assert run_cli("init-topics", env=env).returncode == 0
    trip = run_cli("roundtrip", env=env)
    assert trip.returncode == 0, trip.stderr
    assert trip.stdout.count("byte-identical") == 2
