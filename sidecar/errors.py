"""One exception root for everything the sidecar raises on purpose.

Errors from valkey-py and aiokafka are translated into these at the boundary (``raise ...
from exc``), so callers decide on behaviour flags rather than on a client library's classes.
"""

from __future__ import annotations


class SidecarError(Exception):
    """Root of the sidecar's errors.

    ``retriable`` says whether the same operation may succeed if tried again later (a broker
    that is down, a timeout), as opposed to one that never will (bad configuration, a message
    too large for the topic).
    """

    retriable: bool = False
    # The client that raised it is in a state only a new client clears (an idempotent
    # producer whose sequence numbers the broker no longer accepts).
    needs_new_client: bool = False


class ConfigError(SidecarError):
    """A configuration value is missing, unknown or malformed."""

    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable}: {problem}")


class ServiceUnavailableError(SidecarError):
    """Valkey or Kafka cannot be reached or did not answer in time."""

    retriable = True


class AuthenticationError(SidecarError):
    """The server refused our credentials; retrying with the same ones will not help."""


class AuthorizationError(AuthenticationError):
    """The server knows who we are but an ACL does not allow the operation: the message names
    the principal, the operation and the resource to grant it on. A kind of refused login, so
    that everything that stops on one stops on this too: the same principal never gets further
    by trying again."""


class MessageQueueError(SidecarError):
    """A produce, consume, ack or commit failed for a reason the server gave."""


class RetriableMessageQueueError(MessageQueueError):
    """A produce or commit that failed for a passing reason (leader moved, timeout)."""

    retriable = True


class ServerFullError(MessageQueueError):
    """Valkey at its ``maxmemory`` with ``noeviction`` refused a write (``OOM command not
    allowed``): it succeeds once keys expire or the limit is raised, so it is retried (the
    supervisor's rebuild, with its growing backoff, is the sidecar's backpressure)."""

    retriable = True


class ProducerStateLostError(MessageQueueError):
    """The broker refuses the producer's idempotence state (sequence numbers out of order after
    records expired in a long outage): the same records succeed from a new producer."""

    retriable = True
    needs_new_client = True


class MessageTooLargeError(MessageQueueError):
    """The record is larger than the topic or broker accepts."""


# Every reason a MessageDecodeError gives: label values known before the first one happens.
DECODE_REASONS: tuple[str, ...] = (
    "no_message_field",
    "no_value",
    "not_utf8",
    "not_json",
    "not_object",
    "no_task_id",
    "not_unicode",
)


class MessageDecodeError(SidecarError):
    """A message's value is not a JSON object; ``reason`` is a short code for metrics/DLQ."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class LocalStackError(SidecarError):
    """The local Valkey/Kafka stack could not be fetched, started or stopped."""
