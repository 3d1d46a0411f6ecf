"""The shared SMP vectors (tests/vectors/smp.json), checked with an
independent pure-Python decoder and with the corefarm extension (Rust)."""

import json
import pathlib

import pytest

import smp_ref

VECTORS = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "tests" / "vectors" / "smp.json").read_text())
MAX = VECTORS["max_payload"]


def ids(vs):
    return [v["name"] for v in vs]


@pytest.mark.parametrize("v", VECTORS["valid"], ids=ids(VECTORS["valid"]))
def test_valid_vector_pure_python(v):
    wire = bytes.fromhex(v["hex"])
    kind, payload = smp_ref.split_frame(wire, MAX)
    assert kind == v["type"]
    assert smp_ref.decode_payload(kind, payload, v["decoded"].get("unit")) == v["decoded"]
    assert smp_ref.encode(kind, v["decoded"]).hex() == v["hex"]


@pytest.mark.parametrize("v", VECTORS["invalid"], ids=ids(VECTORS["invalid"]))
def test_invalid_vector_pure_python(v):
    wire = bytes.fromhex(v["hex"])
    with pytest.raises(smp_ref.DecodeError) as e:
        kind, payload = smp_ref.split_frame(wire, MAX)
        smp_ref.decode_payload(kind, payload, 16)
    assert e.value.kind == v["error"]


corefarm = pytest.importorskip("corefarm", reason="extension not installed: run python/build.sh")


@pytest.mark.parametrize("v", VECTORS["valid"], ids=ids(VECTORS["valid"]))
def test_valid_vector_extension(v):
    kind, fields = corefarm._corefarm.decode(bytes.fromhex(v["hex"]), MAX, v["decoded"].get("unit"))
    assert kind == v["type"]
    assert json.loads(fields) == v["decoded"]
    assert corefarm._corefarm.encode(kind, json.dumps(v["decoded"])).hex() == v["hex"]


@pytest.mark.parametrize("v", VECTORS["invalid"], ids=ids(VECTORS["invalid"]))
def test_invalid_vector_extension(v):
    with pytest.raises(corefarm.ProtocolError) as e:
        corefarm._corefarm.decode(bytes.fromhex(v["hex"]), MAX, 16)
    assert e.value.kind == v["error"]


NOTIFY = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "tests" / "vectors" / "notify.json").read_text())


@pytest.mark.parametrize("v", NOTIFY["valid"], ids=ids(NOTIFY["valid"]))
def test_valid_notification_vector_extension(v):
    kind, fields = corefarm._corefarm.decode(bytes.fromhex(v["hex"]), 1 << 20, None)
    assert kind == "notification"
    assert json.loads(fields) == v["decoded"]
    assert corefarm._corefarm.encode(kind, json.dumps(v["decoded"])).hex() == v["hex"]


@pytest.mark.parametrize("v", NOTIFY["invalid"], ids=ids(NOTIFY["invalid"]))
def test_invalid_notification_vector_extension(v):
    with pytest.raises(corefarm.ProtocolError) as e:
        corefarm._corefarm.decode(bytes.fromhex(v["hex"]), 1 << 20, None)
    assert e.value.kind == v["error"]
