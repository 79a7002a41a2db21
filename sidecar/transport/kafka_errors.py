"""aiokafka's errors as the sidecar's, and a login check that tells a refusal from an outage."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn

from sidecar.errors import (
    AuthenticationError,
    AuthorizationError,
    MessageQueueError,
    MessageTooLargeError,
    ProducerStateLostError,
    RetriableMessageQueueError,
    ServiceUnavailableError,
    SidecarError,
)
from sidecar.transport.options import KafkaSettings

# What an action needs on a topic, by the first word(s) of the action's name; READ otherwise.
_TOPIC_OPERATIONS = (
    ("send", "WRITE"), ("create", "CREATE"), ("describe", "DESCRIBE"),
    ("read positions", "DESCRIBE"), ("read end offsets", "DESCRIBE"),
    ("read topic metadata", "DESCRIBE"), ("read the offsets", "DESCRIBE"),
    ("read offsets", "DESCRIBE"),
)  # fmt: skip


def _acl_needed(exc: kafka_errors.KafkaError, action: str) -> str:
    """The ACL an authorization error says is missing: operation and resource, as
    ``kafka-acls.sh`` names them (aiokafka's error carries the topics or the group)."""
    names = [
        str(name)
        for arg in exc.args
        for name in (sorted(arg) if isinstance(arg, set | frozenset | list | tuple) else [arg])
        if name
    ]
    resource = ", ".join(names)
    if isinstance(exc, kafka_errors.GroupAuthorizationFailedError):
        operation = "DESCRIBE" if action.startswith(("describe", "read")) else "READ"
        return f"{operation} on group {resource or '(the consumer group)'}"
    if isinstance(exc, kafka_errors.ClusterAuthorizationFailedError):
        if action.startswith("create"):
            return "CREATE on the cluster (or on the topics)"
        if action.startswith(("send", "start a producer")):
            # An idempotent producer's id: WRITE on any topic grants it since Kafka 3.0.
            return "IDEMPOTENT_WRITE on the cluster (or WRITE on a topic)"
        return f"what it takes to {action} on the cluster"
    operation = next((op for prefix, op in _TOPIC_OPERATIONS if action.startswith(prefix)), "READ")
    return f"{operation} on topic {resource or '(the topic)'}"


def translate_kafka_error(exc: BaseException, action: str, where: str) -> SidecarError:
    """The sidecar's error for an aiokafka exception."""
    if isinstance(
        exc,
        kafka_errors.TopicAuthorizationFailedError
        | kafka_errors.GroupAuthorizationFailedError
        | kafka_errors.ClusterAuthorizationFailedError,
    ):
        # Kafka says only that the principal is not authorized; the ACL it lacks is ours to
        # name, or the operator is left to guess from the broker's authorizer log.
        return AuthorizationError(
            f"Kafka at {where} refused to let us {action}: no ACL allows "
            f"{_acl_needed(exc, action)} ({type(exc).__name__.removesuffix('Error')}); "
            "see docs/security.md"
        )
    if isinstance(
        exc,
        kafka_errors.AuthenticationFailedError
        | kafka_errors.SaslAuthenticationFailed
        | kafka_errors.UnsupportedSaslMechanismError
        | kafka_errors.AuthenticationMethodNotSupported,
    ):
        return AuthenticationError(f"Kafka at {where} refused to let us {action}: {exc}")
    if isinstance(exc, kafka_errors.KafkaConnectionError):
        return ServiceUnavailableError(f"cannot reach Kafka at {where} to {action}: {exc}")
    if isinstance(exc, kafka_errors.MessageSizeTooLargeError):
        return MessageTooLargeError(f"Kafka at {where} cannot {action}: {exc}")
    if isinstance(exc, kafka_errors.UnknownTopicOrPartitionError):
        return MessageQueueError(f"Kafka at {where} cannot {action}: the topic does not exist")
    if isinstance(
        exc,
        kafka_errors.OutOfOrderSequenceNumber
        | kafka_errors.UnknownProducerId
        | kafka_errors.ProducerFenced  # what aiokafka makes of InvalidProducerEpoch
        | kafka_errors.InvalidProducerEpoch
        | kafka_errors.InvalidProducerIdMapping,
    ):
        return ProducerStateLostError(
            f"Kafka at {where} refused the producer's sequence to {action}: {exc!r}"
        )
    if isinstance(exc, kafka_errors.KafkaTimeoutError):
        return RetriableMessageQueueError(f"Kafka at {where} timed out trying to {action}")
    if isinstance(exc, kafka_errors.KafkaError) and exc.retriable:
        return RetriableMessageQueueError(f"Kafka at {where} failed to {action}: {exc!r}")
    return MessageQueueError(f"Kafka at {where} failed to {action}: {exc!r}")


@contextmanager
def translate_kafka_errors(action: str, where: str) -> Iterator[None]:
    """Raise the sidecar's error for anything aiokafka raises inside the block."""
    try:
        yield
    except kafka_errors.KafkaError as exc:
        raise translate_kafka_error(exc, action, where) from exc


def kafka_where(settings: KafkaSettings) -> str:
    """The bootstrap servers, as named in errors, with the principal we log in as (SASL), whom
    an ACL error concerns."""
    servers = ",".join(settings.bootstrap_servers)
    if settings.security_protocol.startswith("SASL_") and settings.sasl_username:
        return f"{servers} as User:{settings.sasl_username}"
    return servers


async def check_login(settings: KafkaSettings) -> None:
    """Raise :class:`AuthenticationError` if Kafka refuses our TLS or SASL login.

    aiokafka only logs why its bootstrap connections failed (refused credentials, a certificate
    not signed by the CA) and raises a connection error that looks like a broker that is down,
    which a supervisor would retry forever. One connection made by hand before the clients start
    tells the two apart. A broker that is really unreachable is left to the clients to report.
    """
    if settings.security_protocol == "PLAINTEXT":
        return
    options = settings.client_kwargs()
    action = "log in"
    if settings.security_protocol.startswith("SASL_"):
        action += f" as {settings.sasl_username!r} with {settings.sasl_mechanism}"
    for server in settings.bootstrap_servers:
        host, _, port = server.rpartition(":")
        try:
            connection = await create_conn(
                host,
                int(port),
                client_id=settings.client_id,
                request_timeout_ms=settings.request_timeout_ms,
                ssl_context=options.get("ssl_context"),
                security_protocol=settings.security_protocol,
                sasl_mechanism=options.get("sasl_mechanism"),
                sasl_plain_username=options.get("sasl_plain_username"),
                sasl_plain_password=options.get("sasl_plain_password"),
            )
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError):
            continue  # dropped mid-handshake: a broker starting or restarting, not a refusal
        except ssl.SSLError as exc:
            raise AuthenticationError(
                f"Kafka at {server}: TLS handshake failed ({exc.reason or exc}); "
                "is KAFKA_SSL_CAFILE the CA that signed the broker's certificate?"
            ) from exc
        except kafka_errors.KafkaError as exc:
            translated = translate_kafka_error(exc, action, server)
            if not translated.retriable:
                raise translated from exc
        except (OSError, TimeoutError):
            continue
        else:
            connection.close()
            return  # one broker accepted us; the others hold the same users
