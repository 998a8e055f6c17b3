"""The request channel: the guarded server tells the inference endpoint that the body arrived and that the client
left, so the endpoint needs neither a watcher task nor a body-read timeout (app/api/request_channel.py)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import orjson

from app.api.request_channel import KEY, RequestChannel, channel_of
from tests.api.test_proxy import leave_mid_stream
from tests.conftest import PUBLIC_MODEL, gateway_config, running_guarded_gateway
from tests.servers import FakeUpstream, free_port, serve_in_thread


def test_a_lost_connection_calls_the_registered_callback_once() -> None:
    channel = RequestChannel()
    calls: list[int] = []
    channel.when_lost(lambda: calls.append(1))
    channel.connection_lost()
    channel.connection_lost()
    assert calls == [1] and channel.lost


def test_a_callback_registered_after_the_loss_runs_at_once() -> None:
    channel = RequestChannel()
    channel.connection_lost()
    calls: list[int] = []
    channel.when_lost(lambda: calls.append(1))
    assert calls == [1]


def test_a_cleared_callback_is_not_called() -> None:
    channel = RequestChannel()
    calls: list[int] = []
    channel.when_lost(lambda: calls.append(1))
    channel.when_lost(None)
    channel.connection_lost()
    assert calls == []


def test_a_scope_without_extensions_has_no_channel() -> None:
    channel = RequestChannel()
    assert channel_of({"type": "http"}) is None
    assert channel_of({"extensions": {}}) is None
    assert channel_of({"extensions": {KEY: channel}}) is channel


def test_under_the_guarded_server_a_client_that_leaves_mid_stream_aborts_the_upstream_call() -> None:
    fake = FakeUpstream()
    with serve_in_thread(fake.app()) as upstream:
        cfg = gateway_config([upstream], listen={"host": "127.0.0.1", "port": free_port()})
        with running_guarded_gateway(cfg) as url:
            leave_mid_stream(url, fake)
            # The next request on a new connection is served as usual.
            ok = httpx.post(url + "/v1/chat/completions", timeout=10,
                            json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert ok.status_code == 200


def test_under_the_guarded_server_a_body_sent_in_parts_is_read_whole() -> None:
    """The body arrives after the headers (two writes): the endpoint reads it under its deadline, not as arrived."""
    fake = FakeUpstream()
    with serve_in_thread(fake.app()) as upstream:
        cfg = gateway_config([upstream], listen={"host": "127.0.0.1", "port": free_port()})
        with running_guarded_gateway(cfg) as url:
            port = int(url.rsplit(":", 1)[1])
            payload = orjson.dumps({"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]})
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n" % len(payload))

            async def send_in_parts() -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                writer.write(head)
                await writer.drain()
                await asyncio.sleep(0.3)
                writer.write(payload)
                await writer.drain()
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                writer.close()
                return answer

            assert asyncio.run(send_in_parts()).startswith(b"HTTP/1.1 200")


def test_under_the_guarded_server_mixed_case_header_names_are_read() -> None:
    """The endpoint trusts the guarded protocol's lowercase names: X-Request-ID in any case still names the id."""
    with serve_in_thread(FakeUpstream().app()) as upstream:
        cfg = gateway_config([upstream], listen={"host": "127.0.0.1", "port": free_port()})
        with running_guarded_gateway(cfg) as url:
            r = httpx.post(url + "/v1/chat/completions", headers={"X-Request-ID": "Mixed-Case-1"}, timeout=10,
                           json={"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200 and r.headers["x-request-id"] == "Mixed-Case-1"
