"""aiokafka's errors as the sidecar's, and a login check that tells a refusal from an outage."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn

from sidecar.errors import (
    AuthenticationError,
    MessageQueueError,
    MessageTooLargeError,
    ProducerStateLostError,
    RetriableMessageQueueError,
    ServiceUnavailableError,
    SidecarError,
)
from sidecar.transport.options import KafkaSettings


def translate_kafka_error(exc: BaseException, action: str, where: str) -> SidecarError:
    """The sidecar's error for an aiokafka exception."""
    if isinstance(
        exc,
        kafka_errors.AuthenticationFailedError
        | kafka_errors.SaslAuthenticationFailed
        | kafka_errors.UnsupportedSaslMechanismError
        | kafka_errors.AuthenticationMethodNotSupported
        | kafka_errors.TopicAuthorizationFailedError
        | kafka_errors.GroupAuthorizationFailedError
        | kafka_errors.ClusterAuthorizationFailedError,
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
    """The bootstrap servers, as named in errors."""
    return ",".join(settings.bootstrap_servers)


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
