"""Handler errors: did the task fail on one path only, or fail differently on both?

A failed run has no outcome (``None``), so the outcome comparator sees two failures alike
whatever their cause, and a failure alike a run whose outcome is ``None``. The error's type
says which failure it was; its message is left out, since it carries what differs from run to
run (ids, paths, times) as noise.
"""

from __future__ import annotations

from comparators.base import Difference


def error_type(error: str | None) -> str | None:
    """``"ValueError: bad page"`` → ``"ValueError"``; the shadow's handler errors are written
    ``<type>: <message>`` (``sidecar/shadow/handlers.py``)."""
    if error is None:
        return None
    return error.partition(":")[0].strip()


class ErrorComparator:
    """The Redis run's handler error against the Kafka run's, each ``None`` when it did not fail.

    ``failed``: one path failed and the other did not; ``error_changed``: both failed, with
    errors of different types. Both at path ``error``, with the whole errors as the values.
    """

    name: str = "error"

    def compare(self, left: str | None, right: str | None) -> list[Difference]:
        """Differences between the Redis run's error ``left`` and the Kafka run's ``right``."""
        if (left is None) != (right is None):
            return [Difference("error", "failed", left, right)]
        if error_type(left) != error_type(right):
            return [Difference("error", "error_changed", left, right)]
        return []
