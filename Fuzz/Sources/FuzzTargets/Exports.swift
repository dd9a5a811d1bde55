// The libFuzzer callbacks, exported under C names for Sources/fuzz-*/main.c (whose LLVMFuzzerTestOneInput calls
// them). Each returns 0 (the input was run); a violated invariant traps (`fuzzCheck`), which libFuzzer reports as
// a crash, with the input that caused it.

@_cdecl("fluxbus_fuzz_frame_decoder")
public func fluxbusFuzzFrameDecoder(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    FrameDecoderTarget.run(UnsafeBufferPointer(start: data, count: size))
    return 0
}

@_cdecl("fluxbus_fuzz_envelope")
public func fluxbusFuzzEnvelope(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    EnvelopeTarget.run(UnsafeBufferPointer(start: data, count: size))
    return 0
}

@_cdecl("fluxbus_fuzz_router")
public func fluxbusFuzzRouter(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    RouterTarget.run(UnsafeBufferPointer(start: data, count: size))
    return 0
}

/// Traps with `message` when `condition` is false, in release builds too (unlike `assert`).
@inline(__always)
func fuzzCheck(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) {
    if !condition { fuzzFail(message(), file: file, line: line) }
}

/// Prints the violated invariant and traps.
func fuzzFail(_ message: String, file: StaticString = #fileID, line: UInt = #line) -> Never {
    fatalError("invariant violated: \(message)", file: file, line: line)
}

/// Reads the fuzz input front to back; past the end every read is 0 (so any input is a complete program).
struct ByteReader {
    let data: UnsafeBufferPointer<UInt8>
    var pos = 0

    init(_ data: UnsafeBufferPointer<UInt8>) { self.data = data }

    var isAtEnd: Bool { pos >= data.count }
    var remaining: Int { max(0, data.count - pos) }

    mutating func byte() -> UInt8 {
        guard pos < data.count else { return 0 }
        defer { pos += 1 }
        return data[pos]
    }

    /// A number in 0..<n (n > 0), from one byte.
    mutating func below(_ n: Int) -> Int { Int(byte()) % n }

    /// One element of `table`.
    mutating func pick<T>(_ table: [T]) -> T { table[below(table.count)] }

    mutating func bool() -> Bool { byte() & 1 == 1 }

    /// Up to `max` raw bytes (the count from one byte).
    mutating func bytes(max: Int) -> [UInt8] {
        let n = min(below(max + 1), remaining)
        defer { pos += n }
        return Array(data[pos..<(pos + n)])
    }
}
