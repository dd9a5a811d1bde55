"""The shared framing and envelope vectors (protocol/vectors) against this package's decoder and scanner."""
import json
import os
import random

import pytest

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "protocol", "vectors")

from fluxbus.wire import EnvelopeError, FrameDecoder, check_envelope

with open(os.path.join(VECTORS, "framing.json"), encoding="utf-8") as f:
    FRAMING = json.load(f)["cases"]
with open(os.path.join(VECTORS, "envelope.json"), encoding="utf-8") as f:
    ENVELOPE = json.load(f)


def expected_events(case):
    events = []
    for e in case["expect"]:
        if "frame" in e:
            events.append(("frame", e["frame"].encode("utf-8")))
        elif "frame_hex" in e:
            events.append(("frame", bytes.fromhex(e["frame_hex"])))
        elif "empty" in e:
            events.append(("empty", None))
        else:
            events.append(("too-large", e["tooLarge"]))
    return events


def feed(case, chunks):
    decoder = FrameDecoder(case["maxFrame"])
    events = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    return events, decoder.pending


@pytest.mark.parametrize("case", FRAMING, ids=[c["name"] for c in FRAMING])
def test_framing_vector(case):
    data = bytes.fromhex(case["input_hex"])
    want = (expected_events(case), case["pending"])
    assert feed(case, [data]) == want, "all at once"
    assert feed(case, [data[i:i + 1] for i in range(len(data))]) == want, "byte by byte"
    for split in range(len(data) + 1):
        assert feed(case, [data[:split], data[split:]]) == want, f"split at {split}"
    rng = random.Random(case["name"])
    for _ in range(50):
        chunks, i = [], 0
        while i < len(data):
            n = rng.randint(0, 7)
            chunks.append(data[i:i + n])
            i += n
        assert feed(case, chunks) == want, "random chunks"


@pytest.mark.parametrize("case", ENVELOPE["cases"], ids=[c["name"] for c in ENVELOPE["cases"]])
def test_envelope_vector(case):
    body = case["body"].encode("utf-8") if "body" in case else bytes.fromhex(case["body_hex"])
    if case["expect"] == "ok":
        envelope = check_envelope(body)
        assert envelope.keys == case["keys"]
        for key, raw in case.get("raw", {}).items():
            assert envelope.raw[key] == raw
    else:
        with pytest.raises(EnvelopeError) as caught:
            check_envelope(body)
        assert caught.value.code == case["expect"]
