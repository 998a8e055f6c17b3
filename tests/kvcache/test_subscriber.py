"""KvEventsHub against a real in-process ZMQ publisher speaking vLLM's wire format (tests/kvcache/vllm_wire.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from app.kvcache.sources import is_bind_endpoint
from app.kvcache.subscriber import EventSource, KvEventsHub
from tests.kvcache.vllm_wire import WirePublisher, cleared, free_port, removed, stored

URL = "http://replica-a:8000"


async def until(cond: Callable[[], bool], within: float = 5.0) -> None:
    """Wait for `cond` (events cross real sockets, so arrival takes a few ms)."""
    deadline = asyncio.get_running_loop().time() + within
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ports() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
async def pub(ports: tuple[str, str]) -> AsyncIterator[WirePublisher]:
    p = WirePublisher(ports[0], ports[1])
    yield p
    await p.close()


async def started(hub: KvEventsHub) -> KvEventsHub:
    await hub.start()
    return hub


async def test_fresh_replica_becomes_whole_and_events_fill_the_index(
    pub: WirePublisher, ports: tuple[str, str]
) -> None:
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])]))
    try:
        await until(lambda: hub.is_whole(URL))
        await asyncio.sleep(0.2)  # SUB subscription propagation (ZMQ slow joiner); a lost frame would be a gap
        pub.publish([stored([1, 2, 3])])
        await until(lambda: hub.overlap_blocks(URL, [1, 2, 3, 4]) == 3)
        pub.publish([removed([2])])
        await until(lambda: hub.overlap_blocks(URL, [1, 2, 3]) == 1)
        st = hub.stats(URL)
        assert (st.batches, st.events, st.gaps) == (2, 2, 0)
        assert st.lag_s is not None and st.lag_s < 5
    finally:
        await hub.stop()


async def test_late_subscriber_catches_up_through_replay(pub: WirePublisher, ports: tuple[str, str]) -> None:
    for h in range(5):
        pub.publish([stored([h], parent=h - 1 if h else None)])
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])]))
    try:
        await until(lambda: hub.is_whole(URL) and hub.overlap_blocks(URL, [0, 1, 2, 3, 4]) == 5)
        assert hub.stats(URL).replays >= 1
        assert hub.stats(URL).last_seq == 4
    finally:
        await hub.stop()


async def test_sequence_gap_is_replayed_and_counted(pub: WirePublisher, ports: tuple[str, str]) -> None:
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])]))
    try:
        await until(lambda: hub.is_whole(URL))
        await asyncio.sleep(0.2)
        pub.publish([stored([1])])
        await until(lambda: hub.stats(URL).last_seq == 0)
        pub.publish([stored([2], parent=1)], send=False)  # lost on PUB/SUB, still in the replay buffer
        pub.publish([stored([3], parent=2)])
        await until(lambda: hub.overlap_blocks(URL, [1, 2, 3]) == 3 and hub.is_whole(URL))
        assert hub.stats(URL).gaps == 1
        assert hub.stats(URL).last_seq == 2
    finally:
        await hub.stop()


async def test_overrun_replay_buffer_clears_replica_and_waits_out_grace(ports: tuple[str, str]) -> None:
    pub = WirePublisher(ports[0], ports[1], buffer_steps=2)
    clock = Clock()
    changes: list[tuple[str, bool, str]] = []
    hub = KvEventsHub(
        [(URL, ports[0], ports[1])], resync_grace_s=30, clock=clock, on_change=lambda *c: changes.append(c)
    )
    try:
        for h in range(5):
            pub.publish([stored([h])])
        await hub.start()
        await until(lambda: hub.stats(URL).unrecoverable == 1)
        await until(lambda: not hub.is_whole(URL) and hub.stats(URL).not_whole_reason == "gapped")
        assert hub.overlap_blocks(URL, [0]) == 0
        clock.now += 31
        assert hub.is_whole(URL)
        assert changes[-1] == (URL, True, "")
        await asyncio.sleep(0.2)
        pub.publish([stored([9])])
        await until(lambda: hub.overlap_blocks(URL, [9]) == 1)
    finally:
        await hub.stop()
        await pub.close()


async def test_replica_without_replay_endpoint_is_gapped_until_grace(ports: tuple[str, str]) -> None:
    pub = WirePublisher(ports[0], None)
    clock = Clock()
    hub = await started(KvEventsHub([(URL, ports[0], None)], resync_grace_s=10, clock=clock))
    try:
        await until(lambda: hub.stats(URL).unrecoverable == 1)
        assert not hub.is_whole(URL)
        clock.now += 11
        assert hub.is_whole(URL)
    finally:
        await hub.stop()
        await pub.close()


async def test_restarted_engine_clears_the_replica(ports: tuple[str, str]) -> None:
    pub = WirePublisher(ports[0], ports[1])
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])]))
    try:
        await until(lambda: hub.is_whole(URL))
        await asyncio.sleep(0.2)
        pub.publish([stored([1])])
        pub.publish([stored([2], parent=1)])
        await until(lambda: hub.overlap_blocks(URL, [1, 2]) == 2)
        await pub.close()
        await until(lambda: not hub.is_whole(URL))  # the monitor saw the disconnect
        pub = WirePublisher(ports[0], ports[1])  # a new engine process: seq starts at 0 again
        pub.publish([stored([7])])
        await until(lambda: hub.is_whole(URL) and hub.overlap_blocks(URL, [7]) == 1, within=10)
        assert hub.overlap_blocks(URL, [1]) == 0
        assert hub.stats(URL).restarts == 1
    finally:
        await hub.stop()
        await pub.close()


async def test_all_blocks_cleared_empties_the_replica(pub: WirePublisher, ports: tuple[str, str]) -> None:
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])]))
    try:
        await until(lambda: hub.is_whole(URL))
        await asyncio.sleep(0.2)
        pub.publish([stored([1, 2])])
        pub.publish([cleared()])
        await until(lambda: hub.stats(URL).last_seq == 1)
        assert hub.overlap_blocks(URL, [1]) == 0
        assert hub.is_whole(URL)
    finally:
        await hub.stop()


async def test_requests_without_events_make_the_stream_stale(pub: WirePublisher, ports: tuple[str, str]) -> None:
    clock = Clock()
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])], stale_after_s=5, clock=clock))
    try:
        await until(lambda: hub.is_whole(URL))
        await asyncio.sleep(0.2)
        hub.note_request(URL, expected_new_blocks=0)  # a fully cached prompt owes no event
        clock.now += 6
        assert hub.is_whole(URL)
        hub.note_request(URL, expected_new_blocks=2)
        clock.now += 6
        assert not hub.is_whole(URL)
        assert hub.stats(URL).not_whole_reason == "stale"
        pub.publish([stored([1])])
        await until(lambda: hub.is_whole(URL))
    finally:
        await hub.stop()


async def test_collector_binds_and_tells_replicas_apart_by_exact_topic() -> None:
    port = free_port()
    collect = f"tcp://127.0.0.1:{port}"
    ra, rb = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    hub = await started(
        KvEventsHub(
            [
                EventSource("http://a", collect, ra, topic="kv-a", bind=True),
                EventSource("http://b", collect, rb, topic="kv-ab", bind=True),
            ]
        )
    )
    pa = WirePublisher(collect, ra, bind=False, topic="kv-a")
    pb = WirePublisher(collect, rb, bind=False, topic="kv-ab")
    try:
        await until(lambda: hub.is_whole("http://a") and hub.is_whole("http://b"))
        await asyncio.sleep(0.3)
        pa.publish([stored([1])])
        pb.publish([stored([2])])
        await until(lambda: hub.overlap_blocks("http://a", [1]) == 1 and hub.overlap_blocks("http://b", [2]) == 1)
        assert hub.overlap_blocks("http://a", [2]) == 0  # "kv-a" is a prefix of "kv-ab": not a match
        assert hub.overlap_blocks("http://b", [1]) == 0
    finally:
        await hub.stop()
        await pa.close()
        await pb.close()


async def test_unreachable_replica_is_not_whole(ports: tuple[str, str]) -> None:
    hub = await started(KvEventsHub([(URL, ports[0], ports[1])], replay_timeout_s=0.2))
    try:
        await asyncio.sleep(0.3)
        assert not hub.is_whole(URL)
        assert hub.stats(URL).not_whole_reason == "disconnected"
        assert not hub.is_whole("http://unknown")
    finally:
        await hub.stop()


def test_shared_collector_topics_must_differ() -> None:
    with pytest.raises(ValueError, match="distinct topics"):
        KvEventsHub([EventSource("http://a", "tcp://*:5600"), EventSource("http://b", "tcp://*:5600")])


def test_bind_rule_follows_vllm() -> None:
    assert is_bind_endpoint("tcp://*:5557")
    assert is_bind_endpoint("ipc:///tmp/kv")
    assert not is_bind_endpoint("tcp://10.0.0.5:5557")


def test_a_replica_at_an_ipv6_address_is_dialled_and_only_wildcards_make_a_collector() -> None:
    # vLLM's rule reads any "::" as a wildcard; a discovered pod's IPv6 address is a replica to connect to.
    assert is_bind_endpoint("tcp://[fd00::7]:5557")
    assert not EventSource("http://[fd00::7]:8000", "tcp://[fd00::7]:5557").collector
    assert not EventSource("http://[::1]:8000", "tcp://[::1]:5557").collector
    assert not EventSource("http://a", "tcp://10.0.0.5:5557").collector
    assert EventSource("http://a", "tcp://*:5557").collector
    assert EventSource("http://a", "tcp://[::]:5557").collector
    assert EventSource("http://a", "ipc:///tmp/kv").collector
    assert EventSource("http://a", "tcp://10.0.0.5:5557", bind=True).collector


async def test_a_replica_added_to_a_running_hub_is_subscribed_and_a_removed_one_forgotten(
    pub: WirePublisher, ports: tuple[str, str]
) -> None:
    hub = await started(KvEventsHub([]))
    try:
        hub.follow([EventSource(URL, ports[0], ports[1])])
        await until(lambda: hub.is_whole(URL))
        await asyncio.sleep(0.2)  # ZMQ slow joiner
        pub.publish([stored([1, 2])])
        await until(lambda: hub.overlap_blocks(URL, [1, 2]) == 2)
        hub.follow([])
        assert hub.urls() == [] and hub.index_size() == 0 and not hub.is_whole(URL)
        hub.follow([EventSource(URL, ports[0], ports[1])])  # it comes back: a fresh stream, caught up by replay
        await until(lambda: hub.is_whole(URL) and hub.overlap_blocks(URL, [1, 2]) == 2)
    finally:
        await hub.stop()


def test_a_collector_endpoint_cannot_be_added_at_run_time() -> None:
    hub = KvEventsHub([])
    with pytest.raises(ValueError, match="its own endpoint"):
        hub.add(EventSource(URL, f"tcp://*:{free_port()}"))
