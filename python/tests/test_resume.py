"""A session that outlives its server: the Python client resumes on a new
connection (same address or the next of a list) and every result comes
once, in `map` order; past `reconnect_timeout` it raises ServerLostError
with the count of unanswered inputs. Fake servers, no corefarm binaries."""

import socket

import pytest

import corefarm
from fakeserver import RestartingServer


def inputs(n):
    return [bytes([k]) * 16 for k in range(n)]


def test_map_survives_a_restart_with_each_result_once_in_order():
    seen = {}

    def first(p):
        p.hello()
        p.configuration(credit=4)
        got = [p.data() for _ in range(4)]
        seen["first"] = [i for i, _ in got]
        p.result(*got[0])
        # Closed here: the server is gone with three inputs unanswered.

    def second(p):
        p.hello()
        p.configuration(credit=16)
        got = []
        for _ in range(9):
            got.append(p.data())
            p.result(*got[-1])
        seen["second"] = [i for i, _ in got]
        p.result(*got[0])  # a late duplicate: dropped by the client
        assert p.at_eof()

    srv = RestartingServer([first, second])
    with corefarm.connect(srv.addr, reconnect_timeout=20.0) as c:
        c.configure_benchmark(16, 16, delay_us=0)
        assert list(c.map(inputs(10), window=4, raw=True)) == inputs(10)
        assert c.resumes == 1 and c.server_addr == srv.addr
    srv.join()
    assert seen["first"] == [0, 1, 2, 3]
    # The unanswered ones again under their ids, before anything new.
    assert seen["second"] == list(range(1, 10))


def test_giving_up_raises_server_lost_with_the_unanswered_count():
    def only(p):
        p.hello()
        p.configuration(credit=8)
        got = [p.data() for _ in range(3)]
        p.result(*got[0])

    srv = RestartingServer([only])
    with corefarm.connect(srv.addr, reconnect_timeout=0.3) as c:
        c.configure_benchmark(16, 16, delay_us=0)
        results = c.map(inputs(3), window=3, raw=True)
        assert next(results) == inputs(1)[0]
        with pytest.raises(corefarm.ServerLostError) as e:
            next(results)
    srv.join()
    assert e.value.unanswered == 2
    assert isinstance(e.value, corefarm.ConnectionError)
    assert "2 data message(s) never got their result" in str(e.value)


def test_an_address_list_skips_a_server_that_does_not_answer():
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_addr = "127.0.0.1:%d" % dead.getsockname()[1]
    dead.close()

    def only(p):
        p.hello()
        p.configuration(credit=1)
        ident, body = p.data()
        p.result(ident, body)
        assert p.at_eof()

    for addrs in ([dead_addr, None], f"{dead_addr}, {{}}"):
        srv = RestartingServer([only])
        given = [dead_addr, srv.addr] if isinstance(addrs, list) else addrs.format(srv.addr)
        with corefarm.connect(given) as c:
            c.configure_benchmark(16, 16, delay_us=0)
            assert list(c.map(inputs(1), raw=True)) == inputs(1)
        srv.join()
