"""Lag per stream, including the count fallback when the server cannot say (lag nil)."""

from __future__ import annotations

import valkey.asyncio as avalkey

from sidecar.transport.lag import stream_lag


async def test_lag_from_xinfo_and_the_fallback_when_it_is_nil(
    valkey_client: avalkey.Valkey, unique: str
) -> None:
    ids = [await valkey_client.xadd(unique, {"message": b"{}"}) for _ in range(10)]
    assert await stream_lag(valkey_client, unique, "absent-group") is None
    assert await stream_lag(valkey_client, f"{unique}.missing", "g") is None

    await valkey_client.xgroup_create(unique, "from-start", id="0")
    assert await stream_lag(valkey_client, unique, "from-start") == 10

    # A group created at an arbitrary id: the server leaves lag nil, the fallback counts.
    await valkey_client.xgroup_create(unique, "from-middle", id=ids[3])
    groups = {g["name"]: g for g in await valkey_client.xinfo_groups(unique)}
    assert groups[b"from-middle"]["lag"] is None
    assert await stream_lag(valkey_client, unique, "from-middle") == 6

    await valkey_client.xreadgroup("from-middle", "c", {unique: ">"}, count=2)
    assert await stream_lag(valkey_client, unique, "from-middle") == 4
