"""RespClient against a real Redis: pipelined callers get their own replies, failures surface as typed errors."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from app.store.resp import (
    RespClient,
    RespConnectionError,
    RespError,
    RespTimeout,
    ScriptCall,
    dead_after,
    parse_reply,
)
from app.store.resp_address import RespAddress, encode_command
from tests.servers import free_port
from tests.store.redis_fixtures import RedisServer


def address(url: str) -> RespAddress:
    addr = RespAddress.from_url(url)
    assert addr is not None
    return addr


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[RespClient]:
    """A client on the session's Redis with a loose timeout."""
    c = RespClient(address(redis_url), 2.0)
    yield c
    await c.aclose()


async def test_concurrent_callers_share_one_connection_and_each_gets_its_own_reply(client: RespClient) -> None:
    commands = []
    for i in range(400):
        commands.append(encode_command("CLIENT", "ID") if i % 10 == 0 else encode_command("ECHO", f"v{i}"))
    replies = await asyncio.gather(*(client.execute(c) for c in commands))
    assert [r for i, r in enumerate(replies) if i % 10] == [f"v{i}".encode() for i in range(400) if i % 10]
    connection_ids = {r for i, r in enumerate(replies) if i % 10 == 0}
    assert len(connection_ids) == 1 and isinstance(next(iter(connection_ids)), int)


async def test_replies_split_across_reads_are_reassembled(client: RespClient) -> None:
    big = "x" * 3_000_000  # arrives in many socket reads, between small replies
    replies = await asyncio.gather(
        client.execute(encode_command("ECHO", "a")),
        client.execute(encode_command("ECHO", big)),
        client.execute(encode_command("ECHO", "b")),
    )
    assert replies == [b"a", big.encode(), b"b"]


async def test_nested_arrays_nulls_and_simple_strings_parse(client: RespClient, key_prefix: str) -> None:
    key = f"{key_prefix}h"
    assert await client.execute(encode_command("SET", key, "v")) == b"OK"
    assert await client.execute(encode_command("GET", f"{key_prefix}missing")) is None
    script = "return {1, {KEYS[1], ARGV[1]}, redis.call('GET', KEYS[1])}"
    reply = await client.execute(encode_command("EVAL", script, 1, key, "é"))
    assert reply == [1, [key.encode(), "é".encode()], b"v"]


async def test_an_error_reply_fails_only_its_command_and_keeps_the_connection(
    client: RespClient, key_prefix: str
) -> None:
    key = f"{key_prefix}s"
    first_id = await client.execute(encode_command("CLIENT", "ID"))
    await client.execute(encode_command("SET", key, "text"))
    results: list[object] = await asyncio.gather(
        client.execute(encode_command("INCR", key)),
        client.execute(encode_command("ECHO", "after")),
        return_exceptions=True,
    )
    bad, good = results
    assert isinstance(bad, RespError) and "not an integer" in str(bad) and not bad.noscript
    assert good == b"after"
    assert await client.execute(encode_command("CLIENT", "ID")) == first_id


async def test_noscript_is_reported_and_eval_loads_the_script(client: RespClient, key_prefix: str) -> None:
    call = ScriptCall(f"return 'fresh-{key_prefix}' .. ARGV[1]", 1, 1)  # a sha no server has cached
    body = call.body([f"{key_prefix}k", "!"])
    with pytest.raises(RespError) as err:
        await client.execute(call.evalsha_head + body)
    assert err.value.noscript
    assert await client.execute(call.eval_head + body) == f"fresh-{key_prefix}!".encode()
    assert await client.execute(call.evalsha_head + body) == f"fresh-{key_prefix}!".encode()


async def test_a_cancelled_caller_does_not_shift_later_replies(client: RespClient, key_prefix: str) -> None:
    assert await client.execute(encode_command("PING")) == b"PONG"  # connected
    # BLPOP on an empty list holds the connection's reply queue for 0.2 s, so the caller is cancelled
    # while its command is on the wire and its (null) reply still to come.
    sent = asyncio.ensure_future(client.execute(encode_command("BLPOP", f"{key_prefix}empty", "0.2")))
    await asyncio.sleep(0)  # the command is queued...
    await asyncio.sleep(0)  # ...and written
    sent.cancel()
    assert await client.execute(encode_command("ECHO", "mine")) == b"mine"
    assert sent.cancelled()


async def test_a_caller_cancelled_while_connecting_does_not_abort_the_connect_for_others(redis_url: str) -> None:
    c = RespClient(address(redis_url), 2.0)
    try:
        first = asyncio.ensure_future(c.execute(encode_command("ECHO", "first")))
        second = asyncio.ensure_future(c.execute(encode_command("ECHO", "second")))
        await asyncio.sleep(0)  # both are now waiting for the one connect the first started
        first.cancel()
        assert await second == b"second"
        assert first.cancelled()
    finally:
        await c.aclose()


async def test_an_idle_connection_the_server_closed_is_replaced_before_the_next_command(
    client: RespClient, redis_url: str
) -> None:
    first_id = await client.execute(encode_command("CLIENT", "ID"))
    admin = aioredis.from_url(redis_url)
    try:
        # The server closes our socket before it answers the admin, so the close is seen first.
        assert await admin.execute_command("CLIENT", "KILL", "ID", first_id) == 1
    finally:
        await admin.aclose()
    second_id = await client.execute(encode_command("CLIENT", "ID"))
    assert second_id != first_id


async def test_no_server_is_a_connection_error() -> None:
    c = RespClient(RespAddress(port=free_port()), 1.0)
    try:
        with pytest.raises(RespConnectionError):
            await c.execute(encode_command("PING"))
    finally:
        await c.aclose()


async def test_a_server_restart_fails_waiting_commands_then_the_next_command_reconnects(
    own_redis: RedisServer,
) -> None:
    c = RespClient(address(own_redis.url), 2.0)
    try:
        assert await c.execute(encode_command("PING")) == b"PONG"
        own_redis.stop()
        with pytest.raises(RespConnectionError):
            await c.execute(encode_command("PING"))
        own_redis.start()
        assert await c.execute(encode_command("PING")) == b"PONG"
    finally:
        await c.aclose()


async def test_replies_later_than_the_timeout_fail_their_commands_and_the_connection_serves_on(
    own_redis: RedisServer,
) -> None:
    admin = aioredis.from_url(own_redis.url, socket_timeout=5)
    c = RespClient(address(own_redis.url), 0.1)
    try:
        assert await c.execute(encode_command("PING")) == b"PONG"
        await admin.execute_command("CLIENT", "PAUSE", 400, "ALL")
        results = await asyncio.gather(*(c.execute(encode_command("ECHO", str(i))) for i in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, RespTimeout) for r in results)
        await admin.ping()  # answered once the pause is over
        # The late replies of the three were read and dropped: the next command gets its own.
        assert await c.execute(encode_command("ECHO", "back")) == b"back"
    finally:
        await c.aclose()
        await admin.aclose()


async def test_commands_of_a_burst_the_loop_was_too_busy_to_write_or_read_in_time_are_not_timeouts(
    client: RespClient,
) -> None:
    short = RespClient(client._addr, 0.05)
    try:
        assert await short.execute(encode_command("PING")) == b"PONG"
        # The first command is written at once, the other 49 wait for the next loop turn; the loop then blocks
        # (a burst being parsed) well past the deadline. Redis is not late: the loop is.
        pending = [asyncio.ensure_future(short.execute(encode_command("ECHO", str(i)))) for i in range(50)]
        await asyncio.sleep(0)
        time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop is the case under test
        assert await asyncio.gather(*pending) == [str(i).encode() for i in range(50)]
    finally:
        await short.aclose()


_BUSY = "local t0 = redis.call('TIME') repeat local t = redis.call('TIME') until " \
        "(t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > tonumber(ARGV[1]) return 1"


async def test_one_slow_reply_fails_only_its_command_not_the_ones_behind_it(client: RespClient) -> None:
    c = RespClient(client._addr, 1.0)
    try:
        assert await c.execute(encode_command("PING")) == b"PONG"
        slow = asyncio.ensure_future(c.execute(encode_command("EVAL", _BUSY, 0, 1_300_000)))
        await asyncio.sleep(0.8)
        behind = asyncio.ensure_future(c.execute(encode_command("ECHO", "behind")))  # due 1.8 s after the slow one
        with pytest.raises(RespTimeout):
            await slow  # Redis busy 1.3 s: past its 1 s
        assert await behind == b"behind"
    finally:
        await c.aclose()


async def test_a_connection_silent_past_dead_after_is_dropped_and_the_next_command_reconnects(
    own_redis: RedisServer,
) -> None:
    admin = aioredis.from_url(own_redis.url, socket_timeout=5)
    c = RespClient(address(own_redis.url), 0.1)
    try:
        assert await c.execute(encode_command("PING")) == b"PONG"
        first = c._conn
        await admin.execute_command("CLIENT", "PAUSE", int(dead_after(0.1) * 1000) + 500, "ALL")
        with pytest.raises(RespTimeout):
            await c.execute(encode_command("ECHO", "x"))
        for _ in range(400):  # the dead-peer check runs dead_after() after the command; bounded wait for it
            if first is None or first.closed:
                break
            await asyncio.sleep(0.05)
        await admin.ping()
        assert await c.execute(encode_command("ECHO", "fresh")) == b"fresh"
        assert c._conn is not first
    finally:
        await c.aclose()
        await admin.aclose()


async def test_password_and_database_from_the_url_are_sent_on_connect(own_redis: RedisServer) -> None:
    admin = aioredis.from_url(own_redis.url)
    await admin.config_set("requirepass", "s3cret")
    admin_authed = aioredis.from_url(f"redis://:s3cret@127.0.0.1:{own_redis.port}/5")
    try:
        no_password = RespClient(address(own_redis.url), 2.0)
        with pytest.raises(RespError, match="NOAUTH"):
            await no_password.execute(encode_command("PING"))
        await no_password.aclose()
        c = RespClient(address(f"redis://:s3cret@127.0.0.1:{own_redis.port}/5"), 2.0)
        assert await c.execute(encode_command("SET", "in-db-5", "yes")) == b"OK"
        await c.aclose()
        assert await admin_authed.get("in-db-5") == b"yes"
    finally:
        await admin.aclose()
        await admin_authed.aclose()


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://127.0.0.1:6380/2", RespAddress("127.0.0.1", 6380, None, 2)),
    ("redis://localhost", RespAddress("localhost", 6379, None, 0)),
    ("redis://u:p%40ss@h:1/0", RespAddress("h", 1, None, 0, "u", "p@ss")),
    ("redis://:pw@h:1?db=4", RespAddress("h", 1, None, 4, None, "pw")),
    ("unix:///run/redis.sock?db=3", RespAddress(path="/run/redis.sock", db=3)),
    ("rediss://h:1/0", None),
    ("redis://h:1/0?ssl_cert_reqs=none", None),
])
def test_url_parsing_accepts_what_the_client_speaks_and_rejects_the_rest(
    url: str, expected: RespAddress | None
) -> None:
    assert RespAddress.from_url(url) == expected


def test_handshake_authenticates_before_selecting_the_database() -> None:
    addr = dataclasses.replace(RespAddress(), username="u", password="p", db=3)
    assert addr.handshake() == [encode_command("AUTH", "u", "p"), encode_command("SELECT", 3)]
    assert RespAddress().handshake() == []


def test_script_frames_are_valid_resp_arrays() -> None:
    call = ScriptCall("return 1", 1, 2)
    frame = call.evalsha_head + call.body(["k", "é", ""])
    # A RESP request array parses like a reply: the command then its arguments as bulk strings.
    parsed, end = parse_reply(frame, 0)
    assert end == len(frame)
    assert parsed == [b"EVALSHA", call.sha.encode(), b"1", b"k", "é".encode(), b""]
    with pytest.raises(ValueError):
        call.body(["k"])
