"""The hot path's fast codecs give what the slow ones gave: JSON (orjson, with the standard
library where they differ) and Valkey commands packed by libvalkey's C packer."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import valkey.asyncio as avalkey
from hypothesis import given, settings
from hypothesis import strategies as st
from valkey.asyncio.connection import Connection
from valkey.exceptions import DataError

from sidecar.config import Settings
from sidecar.errors import MessageDecodeError
from sidecar.transport import fastjson
from sidecar.transport.message import decode_task
from sidecar.transport.options import RedisSettings
from sidecar.transport.valkey_client import create_client

# Each is read by json.loads and differently (or not at all) by orjson alone.
WHERE_ORJSON_DIFFERS = [
    b'{"id": 18446744073709551616}',  # orjson: a float
    b'{"id": -9223372036854775809}',  # orjson: a float
    b'{"to_page": 1234567890123456789012345678901234567890}',
    b'{"x": NaN, "y": Infinity, "z": -Infinity}',  # orjson refuses them
    b'{"id": "\\ud800"}',  # a lone surrogate: orjson refuses it
    b'{"big": 1e400}',  # past a double: json gives inf, orjson refuses it
]


def _same(left: Any, right: Any) -> bool:
    """Equal, with NaN equal to itself and types compared too (1 is not 1.0 here)."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left):
        return math.isnan(right)
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)


@pytest.mark.parametrize("text", WHERE_ORJSON_DIFFERS)
def test_loads_gives_what_json_gives_where_orjson_would_not(text: bytes) -> None:
    assert _same(fastjson.loads(text), json.loads(text))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_loads_reads_every_json_text_as_json_does(value: Any) -> None:
    text = json.dumps(value).encode()
    assert _same(fastjson.loads(text), json.loads(text))


@settings(max_examples=300, deadline=None)
@given(JSON.filter(lambda v: "NaN" not in json.dumps(v) and "Infinity" not in json.dumps(v)))
def test_dumps_writes_what_json_reads_back_the_same(value: Any) -> None:
    assert _same(json.loads(fastjson.dumps(value)), value)


def test_dumps_falls_back_for_what_orjson_cannot_write() -> None:
    value = {"big": 2**70, "lone": "\ud800", "ok": [1, "é"]}
    assert json.loads(fastjson.dumps(value)) == value
    assert fastjson.dumps({1: "a"}) == b'{"1":"a"}'  # a key that is not a string
    assert fastjson.dumps({"v": object()}, default=lambda _: "obj") == b'{"v":"obj"}'
    with pytest.raises(TypeError):
        fastjson.dumps({"v": object()})


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff{}", "not_utf8"),
        (b'{"a": 1', "not_json"),
        (b"[1]", "not_object"),
        (b'{"a": 1' + b"9" * 5000 + b"}", "not_json"),  # past Python's digit limit
    ],
)
def test_decode_task_names_what_is_wrong_as_before(value: bytes, reason: str) -> None:
    with pytest.raises(MessageDecodeError) as caught:
        decode_task(value)
    assert caught.value.reason == reason


def _connection_of(client: avalkey.Valkey) -> Connection:
    pool = client.connection_pool
    connection: Connection = pool.connection_class(**pool.connection_kwargs)
    return connection


def test_commands_are_packed_as_valkey_py_packs_them() -> None:
    connection = _connection_of(create_client(RedisSettings()))
    assert type(connection) is not Connection  # the C packer is in use
    plain = Connection()
    commands: list[tuple[Any, ...]] = [
        ("EVALSHA", "abc", 2, b"k\x00ey", "ké", 1.5, 1e20, 2**70, -3, b"x" * 10_000),
        ("CONFIG GET", "maxmemory"),  # a name with a literal argument, sent apart
        (b"CLIENT SETNAME", b"me"),
        ("GET", memoryview(b"mv")),
    ]
    for command in commands:
        assert b"".join(connection.pack_command(*command)) == b"".join(plain.pack_command(*command))


def test_a_value_valkey_py_refuses_is_still_refused_with_its_error() -> None:
    connection = _connection_of(create_client(RedisSettings()))
    with pytest.raises(DataError):
        connection.pack_command("SET", "key", None)
    with pytest.raises(DataError):
        connection.pack_command("SET", "key", True)


async def test_a_client_with_the_c_packer_talks_to_a_real_valkey(
    settings: Settings, unique: str
) -> None:
    async with create_client(settings.redis) as client:
        await client.hset(f"{unique}:h", mapping={"a": b"\x00\xff", "b": 2**70, "c": "ké"})
        assert await client.hgetall(f"{unique}:h") == {
            b"a": b"\x00\xff",
            b"b": str(2**70).encode(),
            b"c": "ké".encode(),
        }
        assert await client.config_get("maxmemory-policy")
        await client.delete(f"{unique}:h")
