import Testing
@testable import FluxJournal

/// The journal's record format: the checksum against its reference, and recovery from every torn or damaged byte.
struct RecordFormatTests {
    /// CRC-32C one bit at a time: slow, and obviously the definition.
    static func referenceCRC(_ bytes: [UInt8]) -> UInt32 {
        var c: UInt32 = 0xFFFF_FFFF
        for b in bytes {
            c ^= UInt32(b)
            for _ in 0..<8 { c = c & 1 != 0 ? (c >> 1) ^ 0x82F6_3B78 : c >> 1 }
        }
        return ~c
    }

    @Test("CRC-32C: RFC 3720's test vectors, and the table-driven code equals the bit-by-bit definition")
    func checksum() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([UInt8](repeating: 0, count: 32)) == 0x8A91_36AA)
        #expect(CRC32C.checksum([UInt8](repeating: 0xFF, count: 32)) == 0x62A8_AB43)
        #expect(CRC32C.checksum((0..<32).map { UInt8($0) }) == 0x46DD_794E)
        var rng = SystemRandomNumberGenerator()
        for length in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 300, 4097] {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &rng) }
            #expect(CRC32C.checksum(bytes) == Self.referenceCRC(bytes), "length \(length)")
            // Continuing over a split equals one pass; a non-contiguous collection takes the same path's result.
            let cut = length / 3
            #expect(CRC32C.checksum(bytes[cut...], continuing: CRC32C.checksum(bytes[..<cut])) == Self.referenceCRC(bytes))
            #expect(CRC32C.checksum(bytes.lazy.map { $0 }) == Self.referenceCRC(bytes))
            #expect(CRC32C.software(bytes) == Self.referenceCRC(bytes), "length \(length), the Swift tables")
        }
        // Differential: the C path (the CPU's crc32 instruction here) against the Swift tables, at every length
        // and alignment up to 300 and on random continuations.
        let block = (0..<300).map { _ in UInt8.random(in: 0...255, using: &rng) }
        for start in 0..<8 {
            for end in stride(from: start, through: block.count, by: 1) {
                let seed = UInt32.random(in: 0...UInt32.max, using: &rng)
                #expect(CRC32C.checksum(block[start..<end], continuing: seed) == CRC32C.software(block[start..<end], continuing: seed))
            }
        }
    }

    static func segment(_ bodies: [String]) -> [UInt8] {
        var out = SegmentHeader.bytes()
        for body in bodies { appendRecord(Array(body.utf8), to: &out) }
        return out
    }

    static let bodies = [#"{"seq":1,"type":"todo/create"}"#, "", #"{"seq":2,"type":"todo/toggle","payload":{"id":1}}"#]

    @Test func wholeSegmentReadsBack() {
        let bytes = Self.segment(Self.bodies)
        let scan = JournalScan(bytes)
        #expect(scan.problem == nil && scan.tornBytes == 0 && scan.version == SegmentHeader.currentVersion)
        #expect(scan.records.map { String(decoding: bytes[$0], as: UTF8.self) } == Self.bodies)
        #expect(scan.validEnd == bytes.count)
    }

    @Test("cut at every byte offset (a crash mid-write): start succeeds, every record is whole or gone")
    func tornAtEveryOffset() {
        let bytes = Self.segment(Self.bodies)
        let full = JournalScan(bytes).records
        for cut in 0...bytes.count {
            let prefix = Array(bytes[..<cut])
            let scan = JournalScan(prefix)
            #expect(scan.problem == nil, "cut at \(cut): \(String(describing: scan.problem))")
            #expect(scan.records == Array(full.prefix(scan.records.count)), "cut at \(cut)")
            #expect(scan.records.allSatisfy { $0.upperBound <= cut })
            #expect(scan.validEnd + scan.tornBytes == cut || cut < SegmentHeader.size, "cut at \(cut)")
            let expected = full.filter { $0.upperBound <= cut }.count
            #expect(scan.records.count == expected, "cut at \(cut)")
        }
    }

    @Test("a flipped byte in a record that more records follow is corruption, with the record's offset")
    func corruptionInTheMiddle() {
        let bytes = Self.segment(Self.bodies)
        let full = JournalScan(bytes).records
        let lastStart = full.last!.lowerBound - recordHeaderSize
        for offset in SegmentHeader.size..<lastStart {
            var damaged = bytes
            damaged[offset] ^= 0x40
            let scan = JournalScan(damaged)
            // The record that holds the offset (its header or body) is the first bad one.
            let recordStart = full.map { $0.lowerBound - recordHeaderSize }.last { $0 <= offset }!
            // Every flip, a length byte's too (the length has a checksum of its own), is corruption at the record
            // that holds it.
            if case .corrupt(let at, _)? = scan.problem {
                #expect(at == recordStart, "flip at \(offset)")
            } else {
                Issue.record("flip at \(offset) not reported as corruption: \(scan)")
            }
            #expect(scan.records.allSatisfy { $0.upperBound <= recordStart }, "flip at \(offset)")
        }
    }

    @Test("a tail of zero bytes (blocks allocated, never written, after a power loss) is torn, not corruption")
    func zeroTail() {
        var bytes = Self.segment(Self.bodies)
        bytes += [UInt8](repeating: 0, count: 100)
        let scan = JournalScan(bytes)
        #expect(scan.problem == nil && scan.records.count == 3 && scan.tornBytes == 100)
    }

    @Test("a damaged last record reads as torn and is dropped; the others stay")
    func damagedLastRecord() {
        var bytes = Self.segment(Self.bodies)
        bytes[bytes.count - 2] ^= 1
        let scan = JournalScan(bytes)
        #expect(scan.problem == nil)
        #expect(scan.records.count == 2 && scan.tornBytes > 0)
    }

    @Test func notASegment() {
        #expect(JournalScan(Array("NOTAJRNL\u{0}\u{1}\u{0}\u{0}".utf8)).problem == .notASegment(reason: "it does not start with FLUXJRNL"))
        var newer = SegmentHeader.bytes(version: SegmentHeader.currentVersion + 1)
        appendRecord([1, 2, 3], to: &newer)
        if case .notASegment(let reason)? = JournalScan(newer).problem {
            #expect(reason.contains("format version \(SegmentHeader.currentVersion + 1)"))
        } else {
            Issue.record("a newer version was read")
        }
        #expect(JournalScan(Array("FLUX".utf8)).problem == nil)  // a header cut short: torn, empty
        #expect(JournalScan([]).records.isEmpty)
    }

    @Test func anImpossibleLengthIsCorruptionNotAnAllocation() {
        var bytes = SegmentHeader.bytes()
        let length: [UInt8] = [0xFF, 0xFF, 0xFF, 0xF0]
        let crc = CRC32C.checksum(length)
        bytes += length + [UInt8(crc >> 24), UInt8((crc >> 16) & 0xFF), UInt8((crc >> 8) & 0xFF), UInt8(crc & 0xFF)] + [0, 0, 0, 0]
        bytes += [UInt8](repeating: 0, count: 64)
        if case .corrupt(let at, _)? = JournalScan(bytes).problem { #expect(at == SegmentHeader.size) } else {
            Issue.record("no corruption reported")
        }
    }
}
