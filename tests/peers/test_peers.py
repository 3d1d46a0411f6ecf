"""The independent raw peers (raw_user.py, raw_node.py) against the real
corefarm server and node binaries."""

import pytest

from raw_node import RawNode
from raw_user import RawUser


def start_nodes(corefarm_bin, spawn, nodes_addr, count):
    return spawn([corefarm_bin, "node", "--server", nodes_addr, "--count", str(count)])


def test_raw_user_seed_mode_with_real_nodes(corefarm_bin, server, spawn):
    proc, nodes_addr, users_addr = server()
    start_nodes(corefarm_bin, spawn, nodes_addr, 2)
    # Ask for 2 nodes in a throwaway hello session first, so the seed-mode
    # user below does not race the nodes' connections (a seed user gets the
    # nodes that are free when it connects).
    probe = RawUser(users_addr, hello=True, nodes=2)
    assert probe.hello["nodes"] == 2, proc.stderr()
    probe.close()

    u = RawUser(users_addr)  # opens with a configuration: exactly seed behaviour
    assert u.configure_benchmark(64, 32, delay_us=0) == 0, proc.stderr()
    assert u.run(64, 32, count=200, inputs=3) == 200
    u.close()


def test_raw_user_hello_and_credit_with_real_nodes(corefarm_bin, server, spawn):
    proc, nodes_addr, users_addr = server()
    start_nodes(corefarm_bin, spawn, nodes_addr, 2)
    u = RawUser(users_addr, hello=True, nodes=2)
    assert u.hello["role"] == "server"
    assert u.hello["nodes"] == 2
    assert "credit" in u.hello["features"] and "error" in u.hello["features"]
    assert u.configure_benchmark(16, 16) == 0, proc.stderr()
    # run() only sends while it holds credit; the server rejects data sent
    # without credit with an error, which run() would raise.
    assert u.run(16, 16, count=300, inputs=1) == 300
    assert u.max_credit_seen > 0
    # A second configuration: unused credits carry over, grants resume.
    assert u.configure_benchmark(32, 16) == 0, proc.stderr()
    assert u.run(32, 16, count=50, inputs=2) == 50
    u.close()


def test_real_server_with_raw_nodes(server):
    proc, nodes_addr, users_addr = server()
    nodes = [RawNode(nodes_addr) for _ in range(2)]
    threads = [n.start() for n in nodes]
    u = RawUser(users_addr, hello=True, nodes=2)
    assert u.hello["nodes"] == 2, proc.stderr()
    assert u.configure_benchmark(48, 20, delay_us=10) == 0, proc.stderr()
    assert u.run(48, 20, count=120, inputs=2) == 120
    u.close()
    proc.stop()
    for t in threads:
        t.join(10)
    for n in nodes:
        assert n.error is None, n.error
        assert n.configurations == 1
    assert sum(n.messages for n in nodes) == 120
    assert sum(n.inputs for n in nodes) == 240


def test_configuration_refused_by_every_raw_node_is_reported(server):
    proc, nodes_addr, users_addr = server()
    node = RawNode(nodes_addr)
    t = node.start()
    u = RawUser(users_addr, hello=True, nodes=1)
    assert u.hello["nodes"] == 1, proc.stderr()
    # One core and a non-benchmark bitstream: the raw node refuses it.
    import struct
    from smp_raw import T_CONFIGURATION, T_CONFIGURATION_RESPONSE
    cfg = struct.pack("<IIIIII", 64, 64, 1, 0xC0000000, 0xC0001000, 0xC0002000) + b"not-a-bitstream"
    u.conn.send(T_CONFIGURATION, cfg)
    u.expect_config = True
    ty, p = u._next()
    assert ty == T_CONFIGURATION_RESPONSE
    assert p[0] != 0
    assert u.config_reason, "the server sent no reason before the failed response"
    u.close()
    proc.stop()
    t.join(10)
    assert node.error is None, node.error
