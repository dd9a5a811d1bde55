import Foundation

/// Where the protocol directory is, found from this source file's path so the tests work from any cwd.
enum ProtocolFiles {
    static let root: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()  // FluxCoreTests
        .deletingLastPathComponent()  // Tests
        .deletingLastPathComponent()  // package root
        .appendingPathComponent("protocol")

    static func vectors(_ name: String) throws -> Data {
        try Data(contentsOf: root.appendingPathComponent("vectors").appendingPathComponent(name))
    }
}

/// SplitMix64: a small deterministic generator so every fuzz and split run can be replayed from its seed.
struct SeededRNG: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

func bytes(hex: String) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(hex.utf8.count / 2)
    var it = hex.utf8.makeIterator()
    func nibble(_ c: UInt8) -> UInt8 {
        switch c {
        case 48...57: return c - 48
        case 97...102: return c - 87
        case 65...70: return c - 55
        default: preconditionFailure("bad hex digit \(c)")
        }
    }
    while let hi = it.next(), let lo = it.next() { out.append(nibble(hi) << 4 | nibble(lo)) }
    return out
}

func hex(_ b: some Sequence<UInt8>) -> String { b.map { String(format: "%02x", $0) }.joined() }
