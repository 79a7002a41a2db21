"""The fault suite: marked ``faults``, and a table of every fault's accounting at the end."""

from __future__ import annotations

import pytest
import valkey.asyncio as avalkey

from sidecar.config import Settings
from tests.faults.support import FaultRow, Share

_ROWS = pytest.StashKey[list[FaultRow]]()


@pytest.fixture
def fault_table(request: pytest.FixtureRequest) -> list[FaultRow]:
    """Rows appended here are printed in the fault table after the run."""
    return request.config.stash.setdefault(_ROWS, [])


@pytest.fixture
async def share(settings: Settings, valkey_client: avalkey.Valkey, unique: str) -> Share:
    """The test's own stream, with RAGFlow's group, on the session's Valkey and Kafka."""
    return await Share.prepare(settings, valkey_client, unique)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    terminalreporter.section("fault suite")
    header = ("fault", "written", "missing", "duplicates", "recover s", "note")
    cells = [
        (r.fault, str(r.written), str(r.missing), str(r.duplicates), f"{r.recover_s:.1f}", r.note)
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    for row in [header, *cells]:
        terminalreporter.write_line(
            "  ".join(
                c.ljust(w) if i in (0, 5) else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
