"""Handler notifications (docs/streams.md, "Notifications") from Python
through a real node of `corefarm local`: a test handler set notifies at
the head of a message (its word 1) and at its tail (its byte count); the
client gets both, under the id it submitted, before the message's result."""

import struct

import pytest

import corefarm
from spinimage import FIXTURES, handler_image, rule_set


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    # Word 0 = 8 selects `tally`.
    return handler_image(tmp_path_factory.mktemp("notify"), "tally",
                         [rule_set("tally", 8)], [FIXTURES / "tally.c"])


def test_notifications_come_before_the_result(one_node, image):
    sizes = [16, 4096, 160]
    with corefarm.connect(one_node.users_addr, nodes=1, timeout=60) as c:
        assert "spin-notify" in c.server_hello["features"]
        c.configure(image)
        assert c.recv_notification(timeout=0.01) is None
        for i, size in enumerate(sizes):
            msg = struct.pack("<2I", 8, 0xA0 + i) + bytes(size - 8)
            sent = c.submit(msg)
            out = c.recv(timeout=60)
            assert out.id == sent and bytes(out.data)[:8] == struct.pack("<Q", size)
            # Its result is in, so its notifications are already queued.
            head = c.recv_notification(timeout=0)
            tail = c.recv_notification(timeout=0)
            assert head is not None and tail is not None, i
            assert head.data == b"head" + struct.pack("<I", 0xA0 + i)
            assert tail.data == struct.pack("<Q", size)
            assert head.id == tail.id == sent and (head.set, tail.set) == (0, 0)
            ident, handler_set, data = tail  # also a plain tuple
            assert (ident, handler_set, data) == (tail.id, 0, tail.data)
        assert c.recv_notification(timeout=0.01) is None
        assert c.notifications_dropped == 0


def test_asyncio_clients_get_notifications_too(one_node, image):
    import asyncio

    import corefarm.aio

    async def main():
        async with await corefarm.aio.connect(one_node.users_addr, nodes=1, timeout=60) as c:
            await c.configure(image)
            msg = struct.pack("<2I", 8, 0xB0) + bytes(56)
            out = await c.run(msg)
            assert bytes(out.data)[:8] == struct.pack("<Q", 64)
            head = await c.recv_notification(timeout=0)
            tail = await c.recv_notification(timeout=0)
            assert head.data == b"head" + struct.pack("<I", 0xB0)
            assert tail.data == struct.pack("<Q", 64)
            assert head.id == tail.id == out.id
            assert await c.recv_notification(timeout=0.01) is None

    asyncio.run(main())
