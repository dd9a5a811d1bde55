// The journal's segment format, version 1 (docs/journal.md). A segment file is
//
//     header:  "FLUXJRNL" (8 bytes)  version (u16, big-endian)  reserved (u16, 0)
//     record*: length (u32, big-endian: bytes of body)  crc32c of the length's 4 bytes (u32, big-endian)
//              crc32c of body (u32, big-endian)  body
//
// Records are only ever appended. A crash can leave the last record torn (its bytes cut short, or not all of them
// reached the disk); anything else wrong is corruption. `JournalScan` tells the two apart: a record cut short by
// the end of the file, or a last record whose body checksum fails, is torn and dropped; a record whose length
// fails its own checksum (a flipped length would otherwise look like a record cut short), or a bad record followed
// by more bytes, is corruption, reported with its offset. (A tail of zero bytes, as a power loss can leave in
// blocks allocated but not written, is torn too.)

/// The bytes that start every segment file.
public enum SegmentHeader {
    /// "FLUXJRNL".
    public static let magic: [UInt8] = Array("FLUXJRNL".utf8)
    /// The format this code writes; it reads every version up to it.
    /// Version 2 (fluxd 0.4.0) adds record kind 9, `patch` (SPEC §16); everything else is as in version 1.
    /// Version 3 adds kind 10, `forget`. Version 4 (issue 27) adds kinds 11 to 13: an action and a state with
    /// fixed-width fields (a state that is also the store's `done` result), and a batch: the records of one loop
    /// iteration in one framed record.
    public static let currentVersion: UInt16 = 4
    /// Header bytes: magic, version, reserved.
    public static let size = 12

    /// The header of a new segment.
    public static func bytes(version: UInt16 = currentVersion) -> [UInt8] {
        magic + [UInt8(version >> 8), UInt8(version & 0xFF), 0, 0]
    }
}

/// The largest record body the format allows (a length above it is corruption, not a huge allocation).
public let maxRecordBytes = 64 << 20

/// Bytes before each record's body: length, the length's checksum, the body's checksum.
public let recordHeaderSize = 12

/// Appends one framed record (length, checksums, body) to `out`.
public func appendRecord<Body: Collection>(_ body: Body, to out: inout [UInt8]) where Body.Element == UInt8 {
    precondition(body.count <= maxRecordBytes, "journal record of \(body.count) bytes")
    let length = UInt32(body.count)
    let lengthBytes = bigEndianBytes(length)
    out.append(contentsOf: lengthBytes)
    out.append(contentsOf: bigEndianBytes(CRC32C.checksum(lengthBytes)))
    out.append(contentsOf: bigEndianBytes(CRC32C.checksum(body)))
    out.append(contentsOf: body)
}

@inline(__always)
func bigEndianBytes(_ v: UInt32) -> [UInt8] {
    [UInt8(v >> 24), UInt8((v >> 16) & 0xFF), UInt8((v >> 8) & 0xFF), UInt8(v & 0xFF)]
}

@inline(__always)
func readBigEndian(_ b: [UInt8], _ at: Int) -> UInt32 {
    UInt32(b[at]) << 24 | UInt32(b[at + 1]) << 16 | UInt32(b[at + 2]) << 8 | UInt32(b[at + 3])
}

/// What reading a segment found.
public struct JournalScan: Sendable, Equatable {
    /// Why the segment cannot be used as it is.
    public enum Problem: Sendable, Equatable {
        /// Not a journal segment (the magic is wrong), or a version newer than this code reads.
        case notASegment(reason: String)
        /// A record in the middle is damaged: its length or checksum is wrong and more bytes follow it. Nothing from
        /// `offset` on can be trusted; a repair truncates there (losing what follows).
        case corrupt(offset: Int, reason: String)
    }

    /// The format version in the header.
    public var version: UInt16 = 0
    /// Each whole record's body, as a byte range of the segment.
    public var records: [Range<Int>] = []
    /// Where the whole records end: the segment's valid length.
    public var validEnd = 0
    /// Bytes after `validEnd` that were a torn last record (dropped; 0 when the segment ended cleanly).
    public var tornBytes = 0
    /// Set when the segment cannot be used.
    public var problem: Problem?

    /// Reads `segment`'s header and records.
    public init(_ segment: [UInt8]) {
        guard segment.count >= SegmentHeader.size else {
            // A crash while the header itself was being written: an empty segment, torn.
            if segment.isEmpty || SegmentHeader.magic.starts(with: segment.prefix(SegmentHeader.magic.count)) {
                tornBytes = segment.count
            } else {
                problem = .notASegment(reason: "it does not start with FLUXJRNL")
            }
            return
        }
        guard segment.starts(with: SegmentHeader.magic) else {
            problem = .notASegment(reason: "it does not start with FLUXJRNL")
            return
        }
        version = UInt16(segment[8]) << 8 | UInt16(segment[9])
        guard version >= 1, version <= SegmentHeader.currentVersion else {
            problem = .notASegment(reason: "format version \(version); this fluxd reads 1 to \(SegmentHeader.currentVersion)")
            return
        }
        var at = SegmentHeader.size
        validEnd = at
        while at < segment.count {
            guard segment.count - at >= recordHeaderSize else {
                tornBytes = segment.count - at  // a record header cut short: only the last record can be
                return
            }
            let length = Int(readBigEndian(segment, at))
            // Where the file's last non-zero byte is: a record that fails and that only zeros follow was cut by a
            // power loss (blocks allocated, not all written), not damaged.
            func onlyZerosFrom(_ offset: Int) -> Bool {
                var i = segment.count - 1
                while i >= offset { if segment[i] != 0 { return false }; i -= 1 }
                return true
            }
            guard CRC32C.checksum(segment[at..<(at + 4)]) == readBigEndian(segment, at + 4) else {
                if onlyZerosFrom(at + 8) {
                    tornBytes = segment.count - at  // nothing but zeros after its length: the last record, not all written
                } else {
                    problem = .corrupt(offset: at, reason: "the length of the record at \(at) fails its checksum")
                }
                return
            }
            let crc = readBigEndian(segment, at + 8)
            let bodyStart = at + recordHeaderSize
            let end = bodyStart + length
            if length > maxRecordBytes {
                problem = .corrupt(offset: at, reason: "a record length of \(length) bytes (at most \(maxRecordBytes))")
                return
            }
            if end > segment.count {
                tornBytes = segment.count - at  // the last record, cut short
                return
            }
            if CRC32C.checksum(segment[bodyStart..<end]) != crc {
                if end == segment.count || onlyZerosFrom(end) {
                    tornBytes = segment.count - at  // the last record, not all of it reached the disk
                } else {
                    problem = .corrupt(offset: at, reason: "the checksum of the record at \(at) does not match its \(length) bytes")
                }
                return
            }
            records.append(bodyStart..<end)
            at = end
            validEnd = at
        }
    }
}
