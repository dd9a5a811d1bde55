"""Exact JSON numbers (SPEC §16.1, ``fluxbus.number``): frames keep every number's exact value (ints as ``int``,
faithful floats as ``float``, the rest as :class:`JSONNumber` keeping its text), a patch's ``test`` compares by exact
decimal value, ``fluxbus.wire.dumps`` writes a JSONNumber's text back, and a client applying deltas compares and
keeps numbers exactly."""
import copy
import decimal
import pickle
import random
import struct
import threading

import pytest

from fakefluxd import LIMITS, FakeFluxd
from fluxbus import Client
from fluxbus.number import JSONNumber, decimal_key, dumps, is_number, loads, numbers_equal, parse_float
from fluxbus.patch import PatchError, apply, diff, json_equal
from fluxbus.wire import dumps as wire_dumps
from fluxbus.wire import loads as wire_loads


def test_faithful_numbers_stay_plain_and_the_others_keep_their_text():
    for text in ["1.0", "1e0", "10e-1", "0.1", "1.5e-7", "12.50", "1e23", "1.7976931348623157e308", "5e-324",
                 "0.30000000000000004", "-0.0", "1E+2", "9007199254740992.0"]:
        value = loads(text)
        assert type(value) is float and value == float(text), text
    for text in ["1", "-0", "9007199254740993", "18446744073709551617", "-1234567890123456789012345678901234567890"]:
        assert type(loads(text)) is int and loads(text) == int(text)
    for text in ["0.10000000000000001", "9007199254740993.0", "1e400", "-1e400", "1e-400", "99999999999999991611392e0",
                 "1.00000000000000001", "2.4703282292062328e-324", "1e999999999", "1e9999999999999999999999"]:
        value = loads(text)
        assert isinstance(value, JSONNumber) and isinstance(value, decimal.Decimal), text
        assert value.text == text and str(value) == text and repr(value) == f"JSONNumber({text!r})"
    assert loads("0.10000000000000001") == decimal.Decimal("0.10000000000000001")
    assert loads("1e400") * 2 == decimal.Decimal("2e400")
    assert float(loads("1e9999999999999999999999")) == float("inf")  # beyond Decimal's exponents: saturated
    assert float(loads("-1e-9999999999999999999999")) == 0.0
    with pytest.raises(ValueError):
        JSONNumber("01")
    with pytest.raises(ValueError):
        loads("[NaN]")
    n = loads("0.10000000000000001")
    assert copy.deepcopy(n) is n and pickle.loads(pickle.dumps(n)).text == n.text
    assert is_number(n) and is_number(1.5) and is_number(3) and not is_number(True) and not is_number("1")


def test_the_faithful_rule_matches_its_definition():
    """A float text is kept plain exactly when the float's repr has the text's exact value."""
    rng = random.Random(26)
    for _ in range(3000):
        f = rng.choice([rng.random(), rng.random() * 1e300, rng.random() * 1e-300, rng.random() * 1e22,
                        5e-324 * rng.randint(1, 1000), float(2 ** 53 + rng.randint(-4, 4))])
        text = format(decimal.Decimal(f), f".{rng.randint(12, 20)}e")
        value = parse_float(text)
        faithful = decimal.Decimal(text) == decimal.Decimal(repr(float(text)))
        assert isinstance(value, float) == faithful, text
        assert parse_float(repr(f)) == f and type(parse_float(repr(f))) is float


def test_exact_decimal_equality_the_spec_examples():
    equal = [("1", "1.0"), ("1", "1e0"), ("1", "10e-1"), ("-0", "0"), ("0e99", "-0.0"), ("1e400", "10e399"),
             ("1e400", "1E+400"), ("1e23", "100000000000000000000000"), ("9007199254740993", "9.007199254740993e15"),
             ("18446744073709551617", "18446744073709551617.0"),
             ("1e9999999999999999999999", "10e9999999999999999999998")]
    unequal = [("9007199254740993", "9007199254740992"), ("0.1", "0.10000000000000001"),
               ("18446744073709551617", "18446744073709551616"), ("1e23", "99999999999999991611392"),
               ("1e400", "1e401"), ("1e-400", "0"), ("1e9999999999999999999999", "1e9999999999999999999998")]
    for a, b in equal:
        assert numbers_equal(loads(a), loads(b)) and json_equal([loads(b)], [loads(a)]), (a, b)
        assert decimal_key(loads(a)) == decimal_key(loads(b))
    for a, b in unequal:
        assert not numbers_equal(loads(a), loads(b)) and not json_equal({"x": loads(b)}, {"x": loads(a)}), (a, b)
    assert numbers_equal(10 ** 23, 1e23) and not numbers_equal(99999999999999991611392, 1e23)  # 1e23's repr
    assert numbers_equal(decimal.Decimal("1.50"), 1.5) and not numbers_equal(decimal.Decimal("0.1"), 0.1 + 2 ** -56)
    assert not json_equal(JSONNumber("1"), True) and not json_equal(1, "1") and not json_equal(JSONNumber("0"), None)
    assert json_equal(JSONNumber("1.5"), 1.5), "a JSONNumber made by hand may be faithful"


def test_dumps_writes_the_text_back():
    doc = loads('{"b":0.10000000000000001,"a":[1e400,9007199254740993,1.5,12345678901234567890.5]}')
    assert wire_dumps(doc) == b'{"a":[1e400,9007199254740993,1.5,12345678901234567890.5],"b":0.10000000000000001}'
    assert dumps(doc["a"]) == "[1e400, 9007199254740993, 1.5, 12345678901234567890.5]"
    assert dumps({"d": decimal.Decimal("1.10")}) == '{"d": 1.10}'
    with pytest.raises(ValueError):
        wire_dumps(decimal.Decimal("NaN"))
    with pytest.raises(TypeError):
        wire_dumps({1, 2})
    assert wire_loads(wire_dumps(doc)) == doc and dumps("fluxbus-number-0") == '"fluxbus-number-0"'


def test_apply_compares_and_keeps_numbers_exactly():
    doc = loads('{"n":9007199254740993,"f":0.10000000000000001,"big":1e400}')
    assert apply(doc, [{"op": "test", "path": "/n", "value": loads("9007199254740993.0")},
                       {"op": "test", "path": "/big", "value": loads("10e399")}]) is doc
    for path, value in [("/n", 9007199254740992), ("/f", 0.1), ("/big", loads("1e401"))]:
        with pytest.raises(PatchError):
            apply(doc, [{"op": "test", "path": path, "value": value}])
    moved = apply(doc, [{"op": "copy", "from": "/f", "path": "/c"}, {"op": "move", "from": "/big", "path": "/m"}])
    assert wire_dumps(moved) == b'{"c":0.10000000000000001,"f":0.10000000000000001,"m":1e400,"n":9007199254740993}'
    assert diff(doc, loads('{"n":9007199254740993.0,"f":1.0000000000000001e-1,"big":10e399}')) == []
    assert diff({"f": 0.1}, {"f": doc["f"]}) == [{"op": "replace", "path": "/f", "value": doc["f"]}]


def frame_text(text):
    body = text.encode()
    return struct.pack(">I", len(body)) + body


def test_a_client_applying_deltas_compares_and_keeps_numbers_exactly():
    fake = FakeFluxd(limits={**LIMITS, "deltaHistory": 1048576})
    client = Client.connect(fake.socket_path, reconnect=False)
    peer = fake.accept()
    try:
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("sub", client.subscribe("nums")))
        thread.start()
        peer.expect_op("subscribe")
        peer.send({"op": "subscribed", "store": "nums", "status": "up", "version": 1, "deltas": True})
        thread.join(5)
        sub = result["sub"]
        peer.sock.sendall(frame_text('{"op":"snapshot","store":"nums","version":1,"seq":1,'
                                     '"state":{"n":9007199254740993,"f":0.10000000000000001}}'))
        assert wire_dumps(sub.next(timeout=5).state) == b'{"f":0.10000000000000001,"n":9007199254740993}'
        peer.sock.sendall(frame_text(
            '{"op":"delta","store":"nums","from":1,"version":2,"seq":2,"patch":[{"op":"test","path":"/f",'
            '"value":10000000000000001e-17},{"op":"add","path":"/m","value":18446744073709551617}]}'))
        state = sub.next(timeout=5).state
        assert wire_dumps(state) == b'{"f":0.10000000000000001,"m":18446744073709551617,"n":9007199254740993}'
        peer.sock.sendall(frame_text('{"op":"delta","store":"nums","from":2,"version":3,"seq":3,'
                                     '"patch":[{"op":"test","path":"/f","value":0.1},{"op":"remove","path":"/m"}]}'))
        client.poll(0.2)
        assert peer.expect_op("subscribe") == {"op": "subscribe", "store": "nums", "deltas": True}
        assert sub.resyncs == 1 and sub.latest.version == 2
    finally:
        client.abort()
        fake.close()
