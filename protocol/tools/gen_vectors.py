#!/usr/bin/env python3
"""Regenerates protocol/vectors/framing.json and protocol/vectors/envelope.json.

The vector files are the frozen conformance fixtures; this script is how they were written. Edit a case here,
rerun, and review the diff: a changed expectation for an existing case is a protocol change (see SPEC.md §13).
Python 3 standard library only.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "..", "vectors")


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def framing_cases():
    ping = b'{"op":"ping","id":"p-1"}'
    pong = b'{"op":"pong","id":"p-1"}'
    hello = b'{"op":"hello","protocol":1,"role":"client","name":"v"}'
    cases = []

    def case(name, max_frame, data, expect, pending, note=None):
        c = {"name": name, "maxFrame": max_frame, "input_hex": data.hex(), "expect": expect, "pending": pending}
        if note:
            c["note"] = note
        cases.append(c)

    case("single frame", 1024, frame(ping), [{"frame": ping.decode()}], 0)
    case("two coalesced frames", 1024, frame(ping) + frame(pong),
         [{"frame": ping.decode()}, {"frame": pong.decode()}], 0)
    case("three frames of different sizes (split at every boundary by the runner)", 1024,
         frame(hello) + frame(b"{}") + frame(ping),
         [{"frame": hello.decode()}, {"frame": "{}"}, {"frame": ping.decode()}], 0)
    case("zero-length frame", 1024, frame(b""), [{"empty": True}], 0)
    case("zero-length frame between frames keeps the stream in sync", 1024,
         frame(ping) + frame(b"") + frame(b"") + frame(pong),
         [{"frame": ping.decode()}, {"empty": True}, {"empty": True}, {"frame": pong.decode()}], 0)
    case("empty input", 1024, b"", [], 0)
    case("truncated length prefix", 1024, b"\x00\x00", [], 2)
    case("truncated body: no frame, bytes stay pending", 1024, struct.pack(">I", 10) + b'{"op"', [], 9)
    case("complete frame then a truncated one", 1024, frame(ping) + frame(pong)[:7],
         [{"frame": ping.decode()}], 7)
    body16 = b'{"a":"0123456"}'
    body16 = body16 + b" " * (16 - len(body16))
    assert len(body16) == 16
    case("length exactly maxFrame is accepted", 16, frame(body16), [{"frame": body16.decode()}], 0)
    body17 = body16 + b" "
    case("length maxFrame + 1 is too large", 16, frame(body17) + frame(ping),
         [{"tooLarge": 17}], 0,
         "the decoder reports tooLarge as soon as the 4 length bytes are in, yields nothing afterwards "
         "and keeps no bytes")
    case("oversized frame after a good one: the stream stops", 1024,
         frame(ping) + struct.pack(">I", 1025) + b"x" * 10 + frame(pong),
         [{"frame": ping.decode()}, {"tooLarge": 1025}], 0)
    case("oversized length prefix alone is enough", 1024, b"\xff\xff\xff\xff",
         [{"tooLarge": 4294967295}], 0)
    big = b'{"k":"' + b"x" * 248 + b'"}'
    assert len(big) == 256
    case("length is big-endian (256 = 00 00 01 00)", 1024, frame(big), [{"frame": big.decode()}], 0,
         "a little-endian reader would see 65536 and report tooLarge")
    case("framing does not look inside the body", 1024, frame(b"not json") + frame(b"[1,2]"),
         [{"frame": "not json"}, {"frame": "[1,2]"}], 0)
    case("body bytes need not be UTF-8 at the framing layer", 1024, frame(b"\xff\xfe"),
         [{"frame_hex": "fffe"}], 0)
    case("many tiny frames", 64, b"".join(frame(b"{}") for _ in range(20)), [{"frame": "{}"}] * 20, 0)
    return cases


def env_cases():
    cases = []

    def ok(name, body, keys, raw=None):
        c = {"name": name}
        if isinstance(body, bytes):
            c["body_hex"] = body.hex()
        else:
            c["body"] = body
        c["expect"] = "ok"
        c["keys"] = keys
        c["raw"] = raw or {}
        cases.append(c)

    def bad(name, body, expect):
        c = {"name": name}
        if isinstance(body, bytes):
            c["body_hex"] = body.hex()
        else:
            c["body"] = body
        c["expect"] = expect
        cases.append(c)

    # valid messages
    ok("ping", '{"op":"ping","id":"p-1"}', ["op", "id"], {"op": '"ping"', "id": '"p-1"'})
    ok("empty object", "{}", [])
    ok("dispatch with nested payload", '{"op":"dispatch","id":"c-1","type":"todo/add","payload":{"title":"milk","tags":["a","b"],"n":[1,2.5,-3e2,{"x":null}]},"settle":true,"cause":41}',
       ["op", "id", "type", "payload", "settle", "cause"],
       {"payload": '{"title":"milk","tags":["a","b"],"n":[1,2.5,-3e2,{"x":null}]}', "settle": "true", "cause": "41"})
    ok("every kind of value", '{"s":"x","n":-0.5e+10,"t":true,"f":false,"z":null,"a":[],"o":{}}',
       ["s", "n", "t", "f", "z", "a", "o"],
       {"s": '"x"', "n": "-0.5e+10", "t": "true", "f": "false", "z": "null", "a": "[]", "o": "{}"})
    ok("whitespace everywhere, raw spans exclude it", ' \t\r\n{ "op" : "ping" ,\n\t"payload" : [ 1 , { "a" : 2 } ] } \n ',
       ["op", "payload"], {"op": '"ping"', "payload": '[ 1 , { "a" : 2 } ]'})
    ok("key order is kept", '{"z":1,"a":2,"m":3}', ["z", "a", "m"])
    ok("escaped key is compared decoded", '{"o\\u0070":"ping"}', ["op"], {"op": '"ping"'})
    ok("all simple escapes", '{"s":"\\" \\\\ \\/ \\b \\f \\n \\r \\t"}', ["s"], {"s": '"\\" \\\\ \\/ \\b \\f \\n \\r \\t"'})
    ok("unicode escapes, upper and lower hex", '{"s":"\\u00e9\\u00E9\\u0000\\uFFFF"}', ["s"])
    ok("surrogate pair escape", '{"s":"\\ud83d\\ude00"}', ["s"], {"s": '"\\ud83d\\ude00"'})
    ok("raw UTF-8 (2, 3 and 4 bytes)", '{"s":"é€😀"}', ["s"], {"s": '"é€😀"'})
    ok("raw UTF-8 boundaries U+0080 U+07FF U+0800 U+FFFF U+10000 U+10FFFF",
       "{\"s\":\"\u0080\u07ff\u0800\uffff\U00010000\U0010ffff\"}", ["s"])
    ok("DEL (0x7f) is allowed raw in a string", b'{"s":"\x7f"}', ["s"])
    ok("numbers: zero, negative zero, fraction, exponents", '{"a":0,"b":-0,"c":0.0,"d":1E5,"e":1e-5,"f":1.5E+3,"g":123456789012345678901234567890}',
       ["a", "b", "c", "d", "e", "f", "g"], {"g": "123456789012345678901234567890", "e": "1e-5"})
    ok("nested duplicate keys are not checked (payloads are opaque)", '{"payload":{"a":1,"a":2}}', ["payload"],
       {"payload": '{"a":1,"a":2}'})
    ok("canonically equivalent keys are different keys (U+00E9 vs e U+0301)", '{"\\u00e9":1,"e\\u0301":2}',
       ["\u00e9", "e\u0301"], {"\u00e9": "1", "e\u0301": "2"})
    ok("key that differs only in case", '{"op":"a","OP":"b"}', ["op", "OP"])
    d64 = '{"a":' + "[" * 63 + "]" * 63 + "}"
    ok("depth 64 (top-level object is depth 1)", d64, ["a"], {"a": "[" * 63 + "]" * 63})
    ok("depth 64 with objects", '{"a":' + '{"a":' * 62 + "{}" + "}" * 62 + "}", ["a"])

    # bad-json
    bad("empty body (whitespace only)", " ", "bad-json")
    bad("depth 65", '{"a":' + "[" * 64 + "]" * 64 + "}", "bad-json")
    bad("depth 65 with objects", '{"a":' + '{"a":' * 63 + "{}" + "}" * 63 + "}", "bad-json")
    bad("depth 65 array at top level", "[" * 65 + "]" * 65, "bad-json")
    bad("trailing bytes", '{"op":"ping"}x', "bad-json")
    bad("two objects", '{"op":"ping"}{"op":"ping"}', "bad-json")
    bad("trailing comma in object", '{"op":"ping",}', "bad-json")
    bad("trailing comma in array", '{"a":[1,]}', "bad-json")
    bad("missing colon", '{"op" "ping"}', "bad-json")
    bad("unquoted key", '{op:"ping"}', "bad-json")
    bad("single quotes", "{'op':'ping'}", "bad-json")
    bad("unterminated object", '{"op":"ping"', "bad-json")
    bad("unterminated string", '{"op":"ping}', "bad-json")
    bad("unterminated nested array", '{"a":[1,2}', "bad-json")
    bad("byte order mark", b'\xef\xbb\xbf{"op":"ping"}', "bad-json")
    bad("comment", '{"op":"ping"/*x*/}', "bad-json")
    bad("bad literal", '{"a":tru}', "bad-json")
    bad("literal case", '{"a":True}', "bad-json")
    bad("NaN", '{"a":NaN}', "bad-json")
    bad("Infinity", '{"a":-Infinity}', "bad-json")
    bad("number: leading zero", '{"a":01}', "bad-json")
    bad("number: negative leading zero", '{"a":-01}', "bad-json")
    bad("number: lone minus", '{"a":-}', "bad-json")
    bad("number: trailing dot", '{"a":1.}', "bad-json")
    bad("number: leading dot", '{"a":.5}', "bad-json")
    bad("number: empty exponent", '{"a":1e}', "bad-json")
    bad("number: exponent sign only", '{"a":1e+}', "bad-json")
    bad("number: plus sign", '{"a":+1}', "bad-json")
    bad("number: hex", '{"a":0x10}', "bad-json")
    bad("bad escape \\x", '{"s":"\\x41"}', "bad-json")
    bad("bad escape \\a", '{"s":"\\a"}', "bad-json")
    bad("escaped single quote", '{"s":"\\\'"}', "bad-json")
    bad("short \\u escape", '{"s":"\\u12"}', "bad-json")
    bad("non-hex \\u escape", '{"s":"\\u12g4"}', "bad-json")
    bad("lone high surrogate escape", '{"s":"\\ud800"}', "bad-json")
    bad("lone high surrogate escape followed by text", '{"s":"\\ud83dx"}', "bad-json")
    bad("lone low surrogate escape", '{"s":"\\udc00"}', "bad-json")
    bad("high surrogate followed by a non-surrogate escape", '{"s":"\\ud83d\\u0041"}', "bad-json")
    bad("two high surrogates", '{"s":"\\ud83d\\ud83d"}', "bad-json")
    bad("reversed surrogate pair", '{"s":"\\ude00\\ud83d"}', "bad-json")
    bad("lone surrogate escape in a key", '{"\\udfff":1}', "bad-json")
    bad("raw tab in string", b'{"s":"a\tb"}', "bad-json")
    bad("raw newline in string", b'{"s":"a\nb"}', "bad-json")
    bad("raw NUL in string", b'{"s":"a\x00b"}', "bad-json")
    bad("raw 0x1f in string", b'{"s":"\x1f"}', "bad-json")
    bad("NUL outside a string", b'{"a":1}\x00', "bad-json")
    bad("invalid UTF-8: overlong 2-byte (C0 AF)", b'{"s":"\xc0\xaf"}', "bad-json")
    bad("invalid UTF-8: overlong 2-byte (C1 BF)", b'{"s":"\xc1\xbf"}', "bad-json")
    bad("invalid UTF-8: overlong 3-byte (E0 80 AF)", b'{"s":"\xe0\x80\xaf"}', "bad-json")
    bad("invalid UTF-8: overlong 4-byte (F0 80 80 AF)", b'{"s":"\xf0\x80\x80\xaf"}', "bad-json")
    bad("invalid UTF-8: encoded surrogate (ED A0 80)", b'{"s":"\xed\xa0\x80"}', "bad-json")
    bad("invalid UTF-8: encoded surrogate pair (ED A0 BD ED B8 80)", b'{"s":"\xed\xa0\xbd\xed\xb8\x80"}', "bad-json")
    bad("invalid UTF-8: above U+10FFFF (F4 90 80 80)", b'{"s":"\xf4\x90\x80\x80"}', "bad-json")
    bad("invalid UTF-8: F5 lead byte", b'{"s":"\xf5\x80\x80\x80"}', "bad-json")
    bad("invalid UTF-8: FF byte", b'{"s":"\xff"}', "bad-json")
    bad("invalid UTF-8: lone continuation byte", b'{"s":"\x80"}', "bad-json")
    bad("invalid UTF-8: truncated 2-byte sequence", b'{"s":"\xc3"}', "bad-json")
    bad("invalid UTF-8: truncated 3-byte sequence", b'{"s":"\xe2\x82"}', "bad-json")
    bad("invalid UTF-8: truncated 4-byte sequence", b'{"s":"\xf0\x9f\x98"}', "bad-json")
    bad("invalid UTF-8: truncated sequence at end of body", b'{"s":"x"}\xe2\x82', "bad-json")
    bad("invalid UTF-8: truncated sequence at the very end of a string body", b'{"s":"\xe2', "bad-json")
    bad("invalid UTF-8 in a key", b'{"\xc3\x28":1}', "bad-json")
    bad("invalid UTF-8 outside strings", b'{"a":1,\xc3\xa9}', "bad-json")
    bad("duplicate key and invalid JSON: bad-json wins", '{"op":"a","op":"b",}', "bad-json")
    bad("duplicate key then unterminated object: bad-json wins", '{"op":"a","op":"b"', "bad-json")
    bad("non-object top level and invalid JSON: bad-json wins", '[1,2', "bad-json")
    bad("scalar with trailing bytes", '1 2', "bad-json")

    # bad-message
    bad("top level array", "[1,2,3]", "bad-message")
    bad("top level string", '"op"', "bad-message")
    bad("top level number", "42", "bad-message")
    bad("top level null", "null", "bad-message")
    bad("top level true with whitespace", " true ", "bad-message")
    bad("depth 64 array at top level is valid JSON but not an object", "[" * 64 + "]" * 64, "bad-message")
    bad("duplicate top-level key", '{"op":"ping","op":"pong"}', "bad-message")
    bad("duplicate top-level key, different values", '{"id":"a","op":"ping","id":1}', "bad-message")
    bad("duplicate top-level key written with an escape", '{"op":"ping","\\u006fp":"pong"}', "bad-message")
    return cases


def main():
    doc = {
        "description": "FluxBus protocol 1 framing vectors; see README.md",
        "cases": framing_cases(),
    }
    with open(os.path.join(VECTORS, "framing.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    doc = {
        "description": "FluxBus protocol 1 envelope vectors; see README.md",
        "maxDepth": 64,
        "cases": env_cases(),
    }
    with open(os.path.join(VECTORS, "envelope.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    names = [c["name"] for c in doc["cases"]]
    assert len(names) == len(set(names)), "duplicate case names"


if __name__ == "__main__":
    main()
