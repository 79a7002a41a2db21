"""Kafka ACLs for a local broker with an authorizer, from ``kafka-acls.sh --add`` command lines.

The tests take the commands from docs/security.md, so what the page tells an operator to run is
what the tests enforce. They are sent with the Admin API (CreateAcls, version 1: Kafka 3.9 and
4.x both accept it); aiokafka's admin client has no method for it, only the request.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest

from sidecar.errors import LocalStackError

# The protocol's codes (org.apache.kafka.common.acl / resource).
RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactional-id": 5}
PATTERN_TYPES = {"literal": 3, "prefixed": 4}
OPERATIONS = {
    "all": 2, "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7, "describe": 8,
    "clusteraction": 9, "describeconfigs": 10, "alterconfigs": 11, "idempotentwrite": 12,
}  # fmt: skip
ALLOW = 3
ANY = 1  # in filters: any resource type, pattern type, operation or permission


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW rule: ``principal`` may ``operation`` on ``resource_type`` ``name``."""

    principal: str
    operation: str
    resource_type: str
    name: str
    pattern: str = "literal"


def parse_acl_command(line: str) -> list[AclBinding]:
    """The bindings one ``kafka-acls.sh ... --add`` line creates (every principal, operation
    and resource given, combined)."""
    words = shlex.split(line, comments=True)
    if not words or not words[0].endswith("kafka-acls.sh") or "--add" not in words:
        raise ValueError(f"not a kafka-acls.sh --add command: {line!r}")
    principals: list[str] = []
    operations: list[str] = []
    resources: list[tuple[str, str]] = []
    pattern = "literal"
    args = iter(words[1:])
    for word in args:
        if word == "--add":
            continue
        if word == "--cluster":
            resources.append(("cluster", "kafka-cluster"))
            continue
        value = next(args, None)
        if value is None:
            raise ValueError(f"{word} without a value in {line!r}")
        if word == "--allow-principal":
            principals.append(value)
        elif word == "--operation":
            if value.lower() not in OPERATIONS:
                raise ValueError(f"unknown operation {value!r} in {line!r}")
            operations.append(value.lower())
        elif word in ("--topic", "--group", "--transactional-id"):
            resources.append((word[2:], value))
        elif word == "--resource-pattern-type":
            if value not in PATTERN_TYPES:
                raise ValueError(f"unknown pattern type {value!r} in {line!r}")
            pattern = value
        elif word not in ("--bootstrap-server", "--command-config"):
            raise ValueError(f"option {word} is not understood here: {line!r}")
    if not (principals and operations and resources):
        raise ValueError(f"a principal, an operation and a resource are needed: {line!r}")
    return [
        AclBinding(principal, operation, kind, name, "literal" if kind == "cluster" else pattern)
        for principal in principals
        for operation in operations
        for kind, name in resources
    ]


async def create_acls(bootstrap_servers: str, bindings: Iterable[AclBinding]) -> None:
    """Create the ACLs as the super user (the broker's PLAINTEXT listener), and wait until the
    broker enforces them (it applies the controller's metadata a moment later)."""
    bindings = list(bindings)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        for binding in bindings:
            request = CreateAclsRequest(
                RESOURCE_TYPES[binding.resource_type], binding.name,
                PATTERN_TYPES[binding.pattern], binding.principal, "*",
                OPERATIONS[binding.operation], ALLOW,
            )  # fmt: skip
            response = await admin._send_request(request)
            for code, message in response.creation_responses:
                if code:
                    raise LocalStackError(f"Kafka refused the ACL {binding}: {code} {message}")
        deadline = time.monotonic() + 30
        while len(await _described(admin)) < len(set(bindings)):
            if time.monotonic() > deadline:
                raise LocalStackError("the broker did not list the ACLs created within 30 s")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def _described(admin: AIOKafkaAdminClient) -> set[tuple[object, ...]]:
    """Every ACL the broker lists."""
    request = DescribeAclsRequest(ANY, None, ANY, None, None, ANY, ANY)
    response = await admin._send_request(request)
    if response.error_code:
        raise LocalStackError(f"DescribeAcls failed: {response.error_message}")
    return {
        (kind, name, pattern, *acl)
        for kind, name, pattern, acls in response.resources
        for acl in acls
    }
