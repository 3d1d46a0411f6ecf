"""The seedpeers experiment's parsing of the seed's test_user and test_node output, its ratios, and its
skip without the seed's binaries (no process is started)."""

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import report  # noqa: E402
import suite  # noqa: E402

# The end of one test_user run as it printed it (tab-indented min and max).
TEST_USER_OUT = """Starting user
Connected to server
Response received from server
Start sending loop
Start receiving loop
Stopping sending loop
sending_throughput= 419793583.272992
Stopping receiving loop
latency_avg= 22365
\t latency_max= 66647
\t latency_min= 648
receiving_throughput= 208727846.361747
Connection to server closed
User finished
"""

# test_node's dump of the configuration it received (delay 919 us in the RBF's 4 bytes).
TEST_NODE_919 = """Connected to server
Config message received from server:
\tType:\t0x01 0x00 0x00 0x00 (CONFIG)
\tSize:\t0x10 0x00 0x00 0x00 (16)
\tiSize:\t0x00 0x80 0x00 0x00 (32768)
\toSize:\t0x00 0x40 0x00 0x00 (16384)
\tnBlk:\t0x00 0x00 0x00 0x00 (0)
\tRBF:
\t\t0x97 0x03 0x00 0x00
Positive response sent to server
"""


def test_test_user_output_is_parsed():
    got = suite.parse_test_user(TEST_USER_OUT)
    assert got == {"sending_throughput": 419793583.272992, "receiving_throughput": 208727846.361747,
                   "latency_avg_us": 22365.0, "latency_min_us": 648.0, "latency_max_us": 66647.0}


def test_a_cut_short_test_user_names_what_is_missing():
    cut = TEST_USER_OUT.split("Stopping receiving loop")[0]
    with pytest.raises(suite.TestUserOutput) as e:
        suite.parse_test_user(cut)
    assert "'Stopping receiving loop'" in str(e.value) and "latency_avg_us" in str(e.value)
    assert "sending_throughput" not in str(e.value)


def test_the_configured_delay_is_read_from_test_node():
    assert suite.parse_seed_node_delay(TEST_NODE_919) == 919
    assert suite.parse_seed_node_delay(TEST_NODE_919.replace("0x97 0x03", "0x00 0x00")) == 0
    assert suite.parse_seed_node_delay("Connected to server\n") is None


def test_test_user_metrics_count_inputs_processed_and_bytes_forwarded():
    fig = suite.parse_test_user(TEST_USER_OUT)
    # The server kept 0.25 CPUs busy over the window.
    m = suite.test_user_metrics(fig, [{"label": "server", "cpu_s": 2.5, "cpus": 0.25},
                                      {"label": "nodes", "cpu_s": 1.0, "cpus": 0.1}])
    rx = 208727846.361747
    # One 32 KiB input per 16 KiB output: inputs processed = 2x the output bytes.
    assert m["input_bps"] == pytest.approx(rx * 2 * 8)
    assert m["output_bps"] == pytest.approx(rx * 8)
    assert m["offered_input_bps"] == pytest.approx(419793583.272992 * 8)
    assert m["messages_per_s"] == pytest.approx(rx / 16384)
    assert m["forwarded_bytes_per_s"] == pytest.approx(rx * 3)
    assert m["server_cpu_s_per_gb"] == pytest.approx(0.25 / (rx * 3 / 1e9))
    assert m["node_cpus"] == 0.1
    assert (m["latency_avg_ms"], m["latency_min_ms"], m["latency_max_ms"]) == (22.365, 0.648, 66.647)


def point(variant, server, peers, runs):
    names = sorted({k for r in runs for k in r})
    return {"key": {"variant": variant, "server": server, "peers": peers}, "status": "ok", "runs": len(runs),
            "metrics": {n: suite.spread([r[n] for r in runs if n in r]) for n in names}}


def test_ratios_pair_rounds_and_divide_the_means():
    seed = [{"input_bps": 2.0e9, "latency_avg_ms": 20.0, "server_cpu_s_per_gb": 0.8},
            {"input_bps": 3.0e9, "latency_avg_ms": 20.0, "server_cpu_s_per_gb": 1.0}]
    fixed = [{"input_bps": 3.0e9, "latency_avg_ms": 6.0, "server_cpu_s_per_gb": 0.6},
             {"input_bps": 3.0e9, "latency_avg_ms": 8.0, "server_cpu_s_per_gb": 0.5}]
    own = [{"input_bps": 5.0e9, "latency_avg_ms": 8.0, "latency_p50_ms": 5.0, "server_cpu_s_per_gb": 0.4}]
    for i, r in enumerate(fixed):
        r.update(suite.pair_ratios(seed[i], r))
    own[0].update(suite.pair_ratios(seed[0], own[0]))
    assert fixed[0]["input_bps_over_seed"] == 1.5 and fixed[1]["input_bps_over_seed"] == 1.0
    assert fixed[0]["server_cpu_s_per_gb_over_seed"] == pytest.approx(0.75)
    assert own[0]["latency_p50_over_seed_avg"] == 0.25 and own[0]["latency_avg_over_seed"] == 0.4
    pts = [point("seed", "seed", "seed", seed), point("credit-fixed-16", "corefarm", "seed", fixed),
           point("own-peers", "corefarm", "corefarm", own),
           {"key": {"variant": "queue", "server": "corefarm", "peers": "seed"}, "status": "failed",
            "reason": "x", "runs": 0, "metrics": {}}]
    rows = {r["variant"]: r for r in suite.seedpeers_table(pts)}
    # A failed variant has no row; ratios are of the means (3.0 / 2.5), ranges round by round.
    assert set(rows) == {"credit-fixed-16", "own-peers"}
    f = rows["credit-fixed-16"]
    assert f["throughput"] == pytest.approx(1.2) and f["throughput_range"] == [1.0, 1.5]
    assert f["cpu_per_gb"] == pytest.approx(0.55 / 0.9)
    assert f["latency_metric"] == "latency_avg_ms" and f["latency"] == pytest.approx(7.0 / 20.0)
    o = rows["own-peers"]
    # corefarm's user reports a median: it is set against test_user's average.
    assert o["latency_metric"] == "latency_p50_ms" and o["latency"] == pytest.approx(5.0 / 20.0)
    assert o["latency_avg"] == pytest.approx(8.0 / 20.0)


def test_without_the_binaries_it_prints_how_to_build_them_and_skips(tmp_path, capsys):
    assert "seedpeers" in suite.EXTRA and "seedpeers" not in suite.EXPERIMENTS
    empty = tmp_path / "seed-build"
    empty.mkdir()
    (empty / "server").write_text("")
    (empty / "server").chmod(0o755)
    assert suite.main(["seedpeers", "--out", str(tmp_path / "r"), "--no-plots", "--seed-build", str(empty)]) == 0
    err = capsys.readouterr().err
    assert "test_user, test_node not found" in err and "server," not in err.split("not found")[0]
    assert "sed -i 's/64\\*64\\*4, 919)/64*64*4, 0)/'" in err and "cmake -S" in err
    doc = json.loads((tmp_path / "r" / "seedpeers.json").read_text())
    assert [p["status"] for p in doc["points"]] == ["skipped"]
    assert str(tmp_path) not in json.dumps(doc["points"])


def test_report_renders_the_comparison(tmp_path):
    seed = [{"input_bps": 2.0e9, "latency_avg_ms": 20.0, "server_cpu_s_per_gb": 0.8, "server_cpus": 0.2}]
    own = [{"input_bps": 3.0e9, "latency_avg_ms": 8.0, "latency_p50_ms": 6.0, "server_cpu_s_per_gb": 0.4,
            "server_cpus": 0.15}]
    own[0].update(suite.pair_ratios(seed[0], own[0]))
    pts = [point("seed", "seed", "seed", seed), point("own-peers", "corefarm", "corefarm", own)]
    doc = {"experiment": "seedpeers", "quick": False, "machine": {}, "notes": [], "points": pts,
           "params": {"input_size": 32768, "output_size": 16384, "runs": 1, "seed_send_s": 10.0,
                      "duration_s": 10.0, "processing_delay_us": 0, "table": suite.seedpeers_table(pts)}}
    text = "\n".join(report.sec_seedpeers(doc, {}))
    row = next(l for l in text.splitlines() if l.startswith("| corefarm's seed-format user and node"))
    assert "**1.50×**" in row and "6.000 ms / 20.0 ms" in row and "**0.50×**" in row


def test_variants_take_turns_and_each_run_is_set_against_the_seed_run_of_its_round(tmp_path, monkeypatch):
    calls = []

    def fake_seed_run(ctx, bins, args, name):
        calls.append(name)
        bps = {"seed": 2e9}.get(name, 1e9 * (len(calls) % 3 + 1))
        return {"input_bps": bps, "latency_avg_ms": 10.0, "server_cpu_s_per_gb": 0.5}, 0

    def fake_own_run(ctx, args, delay):
        calls.append("own-peers")
        assert delay == 0, "the own peers run at the delay test_node was configured with"
        return [{"input_bps": 3e9, "latency_avg_ms": 4.0, "latency_p50_ms": 3.0, "server_cpu_s_per_gb": 0.25}], None

    monkeypatch.setattr(suite, "seed_binaries", lambda d: {n: Path(n) for n in suite.SEED_BINARIES})
    monkeypatch.setattr(suite, "busy_ports", lambda ports=suite.SEED_PORTS: [])
    monkeypatch.setattr(suite, "seed_peers_run", fake_seed_run)
    monkeypatch.setattr(suite, "own_peers_run", fake_own_run)
    monkeypatch.setattr(suite, "find_binary", lambda required=True: Path("/bin/true"))
    assert suite.main(["seedpeers", "--out", str(tmp_path), "--no-plots", "--runs", "2", "--seed-build", "x"]) == 0
    names = [v for v, _, _ in suite.SEEDPEERS_VARIANTS]
    # The second round starts with the second variant.
    assert calls == names + names[1:] + names[:1]
    doc = json.loads((tmp_path / "seedpeers.json").read_text())
    by = {p["key"]["variant"]: p for p in doc["points"]}
    assert all(p["status"] == "ok" and p["runs"] == 2 for p in by.values())
    own = by["own-peers"]["metrics"]
    assert own["input_bps_over_seed"]["mean"] == 1.5 and own["latency_p50_over_seed_avg"]["mean"] == 0.3
    rows = {r["variant"]: r for r in doc["params"]["table"]}
    assert rows["own-peers"]["cpu_per_gb"] == 0.5 and doc["params"]["processing_delay_us"] == 0


def test_ports_in_use_skip_the_experiment_and_say_which(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "seed_binaries", lambda d: {n: Path(n) for n in suite.SEED_BINARIES})
    monkeypatch.setattr(suite, "busy_ports", lambda ports=suite.SEED_PORTS: [9999])
    monkeypatch.setattr(suite, "find_binary", lambda required=True: Path("/bin/true"))
    assert suite.main(["seedpeers", "--out", str(tmp_path), "--no-plots", "--seed-build", "x"]) == 0
    assert "127.0.0.1:9999 in use by another process" in capsys.readouterr().err
    doc = json.loads((tmp_path / "seedpeers.json").read_text())
    assert doc["points"][0]["status"] == "skipped"


def test_busy_ports_sees_a_listener():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        assert suite.busy_ports((port,)) == [port]
    finally:
        s.close()
    assert suite.busy_ports((port,)) == []


def test_verdicts_judge_the_window_and_the_cpu_against_the_seed():
    def pt(variant, **m):
        return {"key": {"variant": variant}, "status": "ok", "runs": 1,
                "metrics": {k: suite.spread([v]) for k, v in m.items()}}
    pts = [pt("seed", input_bps=2e9, latency_avg_ms=20.0, server_cpu_s_per_gb=0.8),
           pt("credit", input_bps=1.9e9, latency_avg_ms=10.0, server_cpu_s_per_gb=1.0),
           pt("credit-fixed-16", input_bps=2.0e9, latency_avg_ms=10.0, server_cpu_s_per_gb=0.6),
           pt("own-peers", input_bps=3e9, latency_avg_ms=5.0, server_cpu_s_per_gb=0.4)]
    v = {x["id"]: x for x in suite.seedpeers_verdicts(pts)}
    # 0.95x the fixed window at the same latency: met, just.
    assert v["seed-peers-window"]["met"] and v["seed-peers-window"]["value"] == pytest.approx(0.95)
    assert v["seed-server-cpu"]["met"] and v["seed-server-cpu"]["value"] == pytest.approx(0.5)
    # A higher latency fails the window even at the same throughput; more CPU fails the other.
    pts[1] = pt("credit", input_bps=2.0e9, latency_avg_ms=11.0)
    pts[3] = pt("own-peers", server_cpu_s_per_gb=0.48)
    v = {x["id"]: x for x in suite.seedpeers_verdicts(pts)}
    assert not v["seed-peers-window"]["met"] and not v["seed-server-cpu"]["met"]
    assert v["seed-server-cpu"]["ratio"] == pytest.approx(1.2)
