"""A server process the local stack started, known by a pid file.

The pid file holds the pid and the process's start time from ``/proc``, so a pid reused by
another program is never mistaken for ours and never signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sidecar.errors import LocalStackError

logger = logging.getLogger(__name__)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks, or ``None`` if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after its ')' are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, start = fields[0], fields[19]
    return None if state in ("Z", "X") else start


class ManagedProcess:
    """Start, find, signal and stop one detached server process."""

    def __init__(self, name: str, pid_file: Path, log_file: Path) -> None:
        self.name = name
        self.pid_file = pid_file
        self.log_file = log_file

    def pid(self) -> int | None:
        """The pid of our running process, or ``None`` (a stale pid file is removed)."""
        try:
            pid_text, start = self.pid_file.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        if _start_time(pid) == start:
            return pid
        self._reap(pid)
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(self, command: Sequence[str], env: dict[str, str] | None = None) -> int:
        """Start ``command`` detached (own session), output to the log file; returns the pid."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            try:
                child = subprocess.Popen(
                    list(command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                )
            except OSError as exc:
                raise LocalStackError(f"cannot start {self.name} ({command[0]}): {exc}") from exc
        start = _start_time(child.pid)
        if start is None:
            raise LocalStackError(f"{self.name} exited at once; see {self.log_file}")
        self.pid_file.write_text(f"{child.pid} {start}\n")
        # The Popen object is dropped; _reap() collects the exit status if we outlive the child.
        return child.pid

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to our process; ``False`` if it is not running."""
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        return True

    def kill(self) -> None:
        """``kill -9``: what a crash looks like. The pid file is left for ``pid()`` to clear."""
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid, 10.0)

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM, then SIGKILL after ``timeout_s``; ``False`` if it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_gone(pid, timeout_s):
            logger.warning(
                "%s (pid %d) ignored SIGTERM for %.0f s; killing", self.name, pid, timeout_s
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._wait_gone(pid, 10.0)
        self.pid_file.unlink(missing_ok=True)
        return True

    def wait_until(
        self,
        answers: Callable[[], bool],
        timeout_s: float,
        interval_s: float,
        *,
        what: str,
        exited_note: str = "",
    ) -> None:
        """Poll ``answers`` until it is true; LocalStackError if the process exits first (with
        its log's tail and ``exited_note``) or ``timeout_s`` passes (saying it did not ``what``)."""
        deadline = time.monotonic() + timeout_s
        while not answers():
            if self.pid() is None:
                raise LocalStackError(
                    f"{self.name} exited during start-up:\n{self.log_tail()}{exited_note}"
                )
            if time.monotonic() > deadline:
                raise LocalStackError(f"{self.name} did not {what} in {timeout_s:.0f} s")
            time.sleep(interval_s)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._reap(pid)
            if _start_time(pid) is None:
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def _reap(pid: int) -> None:
        # Only our own children can be reaped; for others this is a harmless no-op.
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
