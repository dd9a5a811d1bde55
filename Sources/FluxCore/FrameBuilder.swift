#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Writes one JSON object into a frame without Foundation: envelope fields are written directly, and nested
/// values (payloads, states, queries, errors) are spliced in as the exact bytes the sender wrote.
///
///     var b = FrameBuilder(op: "pong")
///     b.string("id", "p-1")
///     let frame = b.finish()          // {"op":"pong","id":"p-1"}
public struct FrameBuilder {
    /// The frame's one allocation, written in place (no copy when `capacity` was enough; one copy into a larger
    /// allocation when not).
    @usableFromInline var storage: FrameStorage
    // Internal (inlinable) for the field writers below: inlined where they are called, a field's key is a
    // constant there, and writing it is a few constant stores instead of a copy loop (Benchmarks/PROFILE.md).
    @usableFromInline var base: UnsafeMutablePointer<UInt8>
    @usableFromInline var count = 0
    @usableFromInline var capacity: Int

    /// Starts an object whose first field is `"op"`. `capacity` is the expected body size: enough avoids a copy.
    @inlinable @inline(__always)
    public init(op: StaticString, capacity: Int = 128) {
        let want = capacity + 16 + op.utf8CodeUnitCount
        storage = FrameStorage.allocate(capacity: want)
        base = storage.elements
        self.capacity = want
        count = 4
        append(UInt8(ascii: "{"))
        append(static: "\"op\":\"")
        append(static: op)
        append(UInt8(ascii: "\""))
    }

    /// Makes room for `n` more bytes.
    @inlinable @inline(__always)
    mutating func reserve(_ n: Int) {
        if count &+ n > capacity { grow(count &+ n) }
    }

    @usableFromInline
    mutating func grow(_ needed: Int) {
        let newCapacity = max(needed, capacity * 2)
        let bigger = FrameStorage.allocate(capacity: newCapacity)
        bigger.elements.update(from: base, count: count)
        storage = bigger
        base = bigger.elements
        capacity = newCapacity
    }

    @inlinable @inline(__always)
    mutating func append(_ byte: UInt8) {
        reserve(1)
        base[count] = byte
        count &+= 1
    }

    @inlinable @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        let n = bytes.count
        guard n > 0 else { return }
        reserve(n)
        UnsafeMutableRawPointer(base + count).copyMemory(from: bytes.baseAddress!, byteCount: n)
        count &+= n
    }

    @inlinable @inline(__always)
    mutating func append(static s: StaticString) {
        append(UnsafeRawBufferPointer(start: s.utf8Start, count: s.utf8CodeUnitCount))
    }

    /// `,"key":`. Inlined: with a literal key, the loop unrolls into constant stores.
    @inlinable @inline(__always)
    mutating func appendKey(_ key: StaticString) {
        let n = key.utf8CodeUnitCount
        reserve(n &+ 4)
        let p = base + count
        p[0] = UInt8(ascii: ",")
        p[1] = UInt8(ascii: "\"")
        let k = key.utf8Start
        for i in 0..<n { p[2 &+ i] = k[i] }
        p[2 &+ n] = UInt8(ascii: "\"")
        p[3 &+ n] = UInt8(ascii: ":")
        count &+= n &+ 4
    }

    private mutating func appendStaticString(_ s: StaticString) {
        append(UInt8(ascii: "\""))
        append(static: s)
        append(UInt8(ascii: "\""))
    }

    private mutating func appendEscapedValue(_ value: String) {
        var bytes: [UInt8] = []
        appendEscaped(value, to: &bytes)
        bytes.withUnsafeBytes { append($0) }
    }

    /// A string field; the value is escaped as JSON requires.
    public mutating func string(_ key: StaticString, _ value: String) {
        appendKey(key)
        appendEscapedValue(value)
    }

    /// A string field whose value is a wire constant.
    public mutating func constant(_ key: StaticString, _ value: StaticString) {
        appendKey(key)
        appendStaticString(value)
    }

    /// An integer field.
    public mutating func int<I: BinaryInteger>(_ key: StaticString, _ value: I) {
        appendKey(key)
        appendDecimal(Int64(value))
    }

    /// An integer field (non-generic: the hot path's `seq`, `version` and peer ids).
    @inlinable @inline(__always)
    public mutating func int(_ key: StaticString, _ value: UInt64) {
        appendKey(key)
        appendDecimal(magnitude: value, negative: false)
    }

    /// An integer field.
    public mutating func int(_ key: StaticString, _ value: Int) {
        appendKey(key)
        appendDecimal(Int64(value))
    }

    /// A boolean field.
    @inlinable @inline(__always)
    public mutating func bool(_ key: StaticString, _ value: Bool) {
        appendKey(key)
        append(static: value ? "true" : "false")
    }

    /// A field whose value is already-valid JSON bytes, copied as they are.
    public mutating func raw<Bytes: Collection>(_ key: StaticString, _ json: Bytes) where Bytes.Element == UInt8 {
        appendKey(key)
        rawBytes(json)
    }

    // Non-generic overloads for the hot path: a generic call across the module boundary is not specialised, and
    // its `append(contentsOf:)` then looks up type metadata at run time on every call.

    /// A field whose value is already-valid JSON bytes, copied as they are.
    @inlinable @inline(__always)
    public mutating func raw(_ key: StaticString, _ json: [UInt8]) {
        appendKey(key)
        json.withUnsafeBytes { append($0) }
    }

    /// A field whose value is already-valid JSON bytes, copied as they are.
    @inlinable @inline(__always)
    public mutating func raw(_ key: StaticString, _ json: ArraySlice<UInt8>) {
        appendKey(key)
        json.withUnsafeBytes { append($0) }
    }

    /// A field whose value is an array of strings.
    public mutating func strings(_ key: StaticString, _ values: [String]) {
        appendKey(key)
        append(UInt8(ascii: "["))
        for (i, v) in values.enumerated() {
            if i > 0 { append(UInt8(ascii: ",")) }
            appendEscapedValue(v)
        }
        append(UInt8(ascii: "]"))
    }

    /// Starts a field whose value the caller writes with `JSONWriter` calls through `rawBytes`.
    @inlinable @inline(__always)
    public mutating func key(_ key: StaticString) { appendKey(key) }

    /// Appends raw JSON bytes at the current position (after `key(_:)`, or between array items).
    public mutating func rawBytes<Bytes: Collection>(_ json: Bytes) where Bytes.Element == UInt8 {
        if let done: Void = json.withContiguousStorageIfAvailable({ append(UnsafeRawBufferPointer($0)) }) {
            return done
        }
        Array(json).withUnsafeBytes { append($0) }
    }

    /// Appends raw JSON bytes at the current position (non-generic, for the hot path).
    @inlinable @inline(__always)
    public mutating func rawBytes(_ json: ArraySlice<UInt8>) {
        json.withUnsafeBytes { append($0) }
    }

    /// Appends a JSON string value at the current position.
    public mutating func stringValue(_ value: String) { appendEscapedValue(value) }

    /// Appends an integer value at the current position.
    public mutating func intValue<I: BinaryInteger>(_ value: I) { appendDecimal(Int64(value)) }

    private mutating func appendDecimal(_ value: Int64) {
        appendDecimal(magnitude: value.magnitude, negative: value < 0)
    }

    /// Writes the digits right to left, straight into the frame, two at a time.
    @usableFromInline
    mutating func appendDecimal(magnitude: UInt64, negative: Bool) {
        if negative { append(UInt8(ascii: "-")) }
        var digits = 1
        var power: UInt64 = 10
        while digits < 20 && magnitude >= power {
            digits &+= 1
            power = power &* 10
        }
        reserve(digits)
        var v = magnitude
        var at = count &+ digits
        let pairs = digitPairs.utf8Start
        while v >= 100 {
            let pair = Int(truncatingIfNeeded: v % 100) &* 2
            v /= 100
            at &-= 2
            base[at] = pairs[pair]
            base[at &+ 1] = pairs[pair &+ 1]
        }
        if v >= 10 {
            let pair = Int(truncatingIfNeeded: v) &* 2
            base[at &- 2] = pairs[pair]
            base[at &- 1] = pairs[pair &+ 1]
        } else {
            base[at &- 1] = UInt8(truncatingIfNeeded: 48 &+ v)
        }
        count &+= digits
    }

    /// Bytes written so far, counting the 4-byte length prefix: the offset in the finished frame's `bytes` at
    /// which the next byte will stand.
    public var byteCount: Int { count }

    /// Closes the object and returns the frame (length prefix filled in), marked for coalescing as given.
    public consuming func finish(coalescing: Coalescing = .none) -> Frame {
        append(UInt8(ascii: "}"))
        storeBigEndianLength(UInt32(count - 4), into: UnsafeMutableRawBufferPointer(start: base, count: 4))
        let header = FrameHeader(count: count, coalescing: coalescing)
        storage.withUnsafeMutablePointerToHeader { $0.pointee = header }
        return Frame(storage: storage)
    }
}

/// "00" "01" ... "99": two decimal digits per lookup.
private let digitPairs: StaticString = """
    00010203040506070809101112131415161718192021222324252627282930313233343536373839\
    40414243444546474849505152535455565758596061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899
    """

/// Appends `value` as a JSON string literal (quotes and escapes included).
public func appendEscaped(_ value: String, to out: inout [UInt8]) {
    out.append(UInt8(ascii: "\""))
    // Most strings (names, codes, patterns, messages) need no escape: one bulk copy then.
    var value = value
    let copied = value.withUTF8 { bytes -> Bool in
        for c in bytes where c < 0x20 || c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") { return false }
        out.append(contentsOf: bytes)
        return true
    }
    if copied {
        out.append(UInt8(ascii: "\""))
        return
    }
    for c in value.utf8 {
        switch c {
        case UInt8(ascii: "\""): out.append(UInt8(ascii: "\\")); out.append(c)
        case UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\")); out.append(c)
        case 0x0A: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
        case 0x0D: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
        case 0x09: out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
        case 0..<0x20:
            let hex = Array("0123456789abcdef".utf8)
            out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), 48, 48, hex[Int(c >> 4)], hex[Int(c & 15)]])
        default: out.append(c)
        }
    }
    out.append(UInt8(ascii: "\""))
}
