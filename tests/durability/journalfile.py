"""Reading fluxd's journal segments (docs/journal.md, format versions 1 to 4) from Python, for the torn and corrupt
journal tests: the 12-byte header ("FLUXJRNL", u16 version, 2 reserved bytes), then records of a u32 big-endian
body length, the CRC-32C of those 4 length bytes, the CRC-32C of the body, and the body.

Only what the tests need of the bodies is decoded (kind byte, then varints and length-prefixed byte strings, or in
version 4's kinds fixed-width little-endian numbers): seq reservations, registrations, actions, results and
snapshots. Since version 4 fluxd writes the records of one loop iteration as one framed `batch` record: a
`Record` is a framed record, and `entries` the records it holds (`kinds` their kinds)."""

import glob
import json
import os
import struct
from typing import Any, Dict, List, Optional, Tuple

MAGIC = b"FLUXJRNL"
HEADER = 12
RECORD_HEADER = 12


def _crc32c_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)


def frame_record(body: bytes) -> bytes:
    length = struct.pack(">I", len(body))
    return length + struct.pack(">I", crc32c(length)) + struct.pack(">I", crc32c(body)) + body


class Record:
    """One whole record of a segment: where it starts and ends, its body, and what the body says."""

    def __init__(self, start: int, body: bytes):
        self.start = start
        self.body = body
        self.end = start + RECORD_HEADER + len(body)
        self.kind, self.fields = decode_body(body)
        # (kind, fields) of each record it holds: itself, or a batch's records (a state that is also a result: both)
        self.entries: List[Tuple[str, Dict[str, Any]]] = decode_entries(body)
        self.kinds = [k for k, _ in self.entries]

    def __repr__(self) -> str:
        return f"Record({self.kind} @{self.start}..{self.end} {self.entries})"


def parse_segment(data: bytes) -> List[Record]:
    """The records of a whole, undamaged segment (AssertionError if it is not one)."""
    assert data[:8] == MAGIC, "not a journal segment"
    (version,) = struct.unpack(">H", data[8:10])
    assert version in (1, 2, 3, 4), f"segment format version {version}; these tests read versions 1 to 4"
    records = []
    at = HEADER
    while at < len(data):
        if not any(data[at:]):
            break  # zeros fluxd reserved ahead of its writes (docs/journal.md): not a record
        assert len(data) - at >= RECORD_HEADER, f"a record header cut short at {at}"
        length_bytes = data[at:at + 4]
        (length,) = struct.unpack(">I", length_bytes)
        (length_crc,) = struct.unpack(">I", data[at + 4:at + 8])
        (body_crc,) = struct.unpack(">I", data[at + 8:at + 12])
        assert crc32c(length_bytes) == length_crc, f"the length of the record at {at} fails its checksum"
        body = data[at + RECORD_HEADER:at + RECORD_HEADER + length]
        assert len(body) == length, f"the record at {at} is cut short"
        assert crc32c(body) == body_crc, f"the body of the record at {at} fails its checksum"
        records.append(Record(at, body))
        at += RECORD_HEADER + length
    return records


class _Reader:
    def __init__(self, body: bytes):
        self.body = body
        self.at = 0

    def byte(self) -> int:
        b = self.body[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7

    def bytes(self) -> bytes:
        n = self.varint()
        out = self.body[self.at:self.at + n]
        assert len(out) == n
        self.at += n
        return out

    def string(self) -> str:
        return self.bytes().decode()

    def u64(self) -> int:
        (v,) = struct.unpack("<Q", self.body[self.at:self.at + 8])
        self.at += 8
        return v

    def u32(self) -> int:
        (v,) = struct.unpack("<I", self.body[self.at:self.at + 4])
        self.at += 4
        return v

    def fixed_bytes(self) -> bytes:
        n = self.u32()
        out = self.body[self.at:self.at + n]
        assert len(out) == n
        self.at += n
        return out

    def strings(self) -> List[str]:
        return [self.string() for _ in range(self.varint())]


KINDS = {1: "seq-reserve", 2: "register", 3: "action", 4: "result", 5: "snapshot", 6: "store-position", 7: "outcome",
         8: "segment-summary", 9: "patch", 10: "forget", 11: "action", 12: "state", 13: "batch"}


def _action_rest(r: "_Reader", f: Dict[str, Any], flags: int, number, blob, uid, type_first: bool) -> None:
    """An action's fields after its flags, read with the version's number and byte-string readers (version 4 has
    the cause, then the type, before the optional id; version 3 read the type before the flags)."""
    if flags & 1:
        f["cause"] = number()
    if type_first:
        f["type"] = json.loads(blob())
    if flags & 2:
        f["id"] = json.loads(blob())
    if flags & 4:
        f["session"] = json.loads(blob())
        f["uid"] = uid()
    f["payload"] = json.loads(blob())
    f["targets"] = r.strings()


def decode_body(body: bytes) -> Tuple[str, Dict[str, Any]]:
    """The kind and the fields the tests use. Kinds the tests do not decode keep their kind name only."""
    r = _Reader(body)
    kind = KINDS.get(r.byte(), "unknown")
    f: Dict[str, Any] = {}
    try:
        if kind == "seq-reserve":
            f["upTo"] = r.varint()
        elif kind == "register":
            f["store"] = r.string()
            f["handles"] = r.strings()
            f["waitFor"] = r.strings()
        elif kind == "action" and body[0] == 11:  # format version 4: fixed-width numbers and lengths
            flags = r.byte()
            f["seq"], f["time"], f["origin"] = r.u64(), r.u64(), r.u64()
            _action_rest(r, f, flags, r.u64, r.fixed_bytes, r.u32, type_first=True)
        elif kind == "state":  # format version 4: a snapshot or patch, and maybe the store's done result
            flags = r.byte()
            f["patch" if flags & 1 else "snapshot"] = True
            f["done"] = bool(flags & 2)
            f["version"], f["seq"] = r.u64(), r.u64()
            f["store"] = r.string()
            f["bytes"] = json.loads(r.fixed_bytes())
        elif kind == "batch":
            f["records"] = []
            while r.at < len(body):
                n = r.u32()
                f["records"].append(body[r.at:r.at + n])
                assert len(f["records"][-1]) == n
                r.at += n
        elif kind == "action":
            f["seq"] = r.varint()
            f["time"] = r.varint()
            f["type"] = json.loads(r.bytes())
            f["origin"] = r.varint()
            _action_rest(r, f, r.byte(), r.varint, r.bytes, r.varint, type_first=False)
        elif kind == "result":
            f["seq"] = r.varint()
            f["store"] = r.string()
            f["version"] = r.varint()
            f["outcome"] = {0: "done", 1: "rejected", 2: "unavailable"}.get(r.byte(), "?")
        elif kind == "snapshot":
            f["store"] = r.string()
            f["version"] = r.varint()
            f["seq"] = r.varint()
            f["state"] = json.loads(r.bytes())
        elif kind == "patch":  # format version 2 (SPEC §16)
            f["store"] = r.string()
            f["version"] = r.varint()
            f["seq"] = r.varint()
            f["patch"] = json.loads(r.bytes())
    except (IndexError, AssertionError, ValueError) as e:
        raise AssertionError(f"a {kind} record does not decode as these tests expect ({e}): {body!r}")
    return kind, f


def decode_entries(body: bytes) -> List[Tuple[str, Dict[str, Any]]]:
    """The records a framed record's body holds, as (kind, fields) in the kinds of version 3: a batch's records,
    and a version-4 state as a snapshot or patch, then its done result."""
    kind, f = decode_body(body)
    if kind == "batch":
        return [e for inner in f["records"] for e in decode_entries(inner)]
    if kind == "state":
        common = {"store": f["store"], "version": f["version"], "seq": f["seq"]}
        out = [("patch", dict(common, patch=f["bytes"])) if f.get("patch") else ("snapshot", dict(common, state=f["bytes"]))]
        if f["done"]:
            out.append(("result", {"seq": f["seq"], "store": f["store"], "version": f["version"], "outcome": "done"}))
        return out
    return [(kind, f)]


def records_end(path: str) -> int:
    """Where a segment's records end (fluxd keeps zeros reserved past them: the file is longer)."""
    with open(path, "rb") as f:
        data = f.read()
    records = parse_segment(data)
    return records[-1].end if records else HEADER


def segments(data_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(data_dir, "journal-*.fjl")))


def checkpoints(data_dir: str) -> List[str]:
    return sorted(glob.glob(os.path.join(data_dir, "checkpoint-*.fjc")))


class Expected:
    """What a fluxd recovering exactly `records` (whole, in order) must show for one store and one session."""

    def __init__(self, records: List[Record], store: str, session: str):
        self.snapshot: Optional[Dict[str, Any]] = None
        self.answered_seq = 0
        self.actions: Dict[int, Dict[str, Any]] = {}  # seq -> action fields
        self.results: Dict[int, Dict[str, Any]] = {}
        self.highest_seq = 0
        for kind, f in (e for rec in records for e in rec.entries):
            if kind == "seq-reserve":
                self.highest_seq = max(self.highest_seq, f["upTo"])
            elif kind == "action":
                self.actions[f["seq"]] = f
                self.highest_seq = max(self.highest_seq, f["seq"])
            elif kind == "result" and f["store"] == store:
                self.results[f["seq"]] = f
                if f["outcome"] != "unavailable":
                    self.answered_seq = max(self.answered_seq, f["seq"])
            elif kind == "snapshot" and f["store"] == store:
                self.snapshot = f
        self.session = session

    def status(self, aid: str) -> str:
        """What `recover` must say of dispatch id `aid` of the session."""
        for seq, a in self.actions.items():
            if a.get("id") == aid and a.get("session") == self.session:
                return "settled" if seq in self.results else "pending"
        return "unknown"

    def seq_of(self, aid: str) -> Optional[int]:
        for seq, a in self.actions.items():
            if a.get("id") == aid:
                return seq
        return None

    def unsettled(self) -> List[int]:
        return sorted(seq for seq in self.actions if seq not in self.results)
