"""Stand-in of ``task_exe()`` in RAGFlow's ``docker/entrypoint.sh``: run the executor, and when
it dies run it again a second later, under the same consumer name, forever.

``python -m entrypoint [executor args]``. SIGTERM/SIGINT are passed to the running executor
(which finishes its tasks in hand and exits 0) and end the loop. Each start is logged as
``entrypoint: executor pid=N start=K``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import FrameType

_RESTART_DELAY_S = 1.0  # entrypoint.sh: `wait; sleep 1`

stopping = False
child: subprocess.Popen[bytes] | None = None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global stopping  # noqa: PLW0603
    stopping = True
    if child is not None and child.poll() is None:
        child.send_signal(signum)


def main(argv: list[str]) -> int:
    global child  # noqa: PLW0603
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    starts = 0
    while not stopping:
        starts += 1
        child = subprocess.Popen([sys.executable, "-m", "rag.svr.task_executor", *argv])
        print(f"entrypoint: executor pid={child.pid} start={starts}", flush=True)
        code = child.wait()
        print(f"entrypoint: executor pid={child.pid} exited {code}", flush=True)
        if not stopping:
            time.sleep(_RESTART_DELAY_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
