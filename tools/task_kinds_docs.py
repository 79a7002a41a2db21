"""Write the table of RAGFlow's task kinds (sidecar/config/task_kinds.py) into the README.

Run from a checkout: ``python -m tools.task_kinds_docs`` rewrites the block between the
markers; ``--check`` only says whether it is stale (exit 1), as ``tests/test_task_kinds.py``
does. The other docs that name the task topics are checked by that test, not written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.config.task_kinds import PARSE, TASK_KINDS, TaskKindRow

ROOT = Path(__file__).resolve().parent.parent
GENERATED = (ROOT / "README.md",)
BEGIN = "<!-- task kinds: written by python -m tools.task_kinds_docs from TASK_KINDS -->"
END = "<!-- /task kinds -->"


def _pattern(row: TaskKindRow) -> str:
    if row.pattern == PARSE:
        return f"none (`{PARSE}`)"
    return f"`{row.pattern}` (prefix)" if row.is_prefix else f"`{row.pattern}`"


def markdown() -> str:
    """The table as the README shows it."""
    lines = [
        "| `task_type` | topic | kind | dataset-wide | key | dry-run check |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {_pattern(row)} | `{row.topic}` | {row.kind} | {'yes' if row.dataset_wide else 'no'}"
        f" | `{row.key}` | {row.check} |"
        for row in TASK_KINDS
    ]
    return "\n".join(lines)


def rendered(text: str, where: str) -> str:
    """``text`` with its block between the markers written from the table."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError(f"{where}: needs one {BEGIN!r} line and one {END!r} line")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{markdown()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    stale = []
    for path in GENERATED:
        text = path.read_text()
        new = rendered(text, str(path.relative_to(ROOT)))
        if new != text:
            stale.append(path.relative_to(ROOT))
            if "--check" not in argv:
                path.write_text(new)
    for name in stale:
        print(f"{name}: {'stale' if '--check' in argv else 'rewritten'}")
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
