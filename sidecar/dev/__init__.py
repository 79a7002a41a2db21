"""Development tooling (local servers, the demo, fault injection): in a checkout, not the wheel."""

from sidecar.dev.commands import add_commands

# The development commands, added to ragflow-sidecar in a checkout.
__all__ = [
    "add_commands",
]
