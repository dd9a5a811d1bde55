/// Writes a nested JSON value (objects and arrays of fields) that a `FrameBuilder` splices into a frame: commas,
/// escapes and nesting are its business, so no reply is assembled from string fragments.
///
///     var j = JSONBuilder()
///     j.object { o in
///         o.field("maxFrame", 1_048_576)
///         o.field("server", "fluxd")
///         o.array("stores") { a in a.value("todos") }
///     }
///     b.raw("limits", j.bytes)         // {"maxFrame":1048576,"server":"fluxd","stores":["todos"]}
public struct JSONBuilder {
    /// The JSON written so far.
    public private(set) var bytes: [UInt8] = []
    /// Whether the container being written needs a comma before its next member.
    private var needsComma = false

    public init(capacity: Int = 64) {
        bytes.reserveCapacity(capacity)
    }

    private mutating func separate() {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
        needsComma = true
    }

    private mutating func key(_ key: StaticString) {
        separate()
        bytes.append(UInt8(ascii: "\""))
        bytes.append(contentsOf: UnsafeBufferPointer(start: key.utf8Start, count: key.utf8CodeUnitCount))
        bytes.append(UInt8(ascii: "\""))
        bytes.append(UInt8(ascii: ":"))
        needsComma = false
    }

    /// Writes an integer's decimal digits (no `String` made: `info` on a bus of 12,000 stores spent a fifth of
    /// its time formatting integers through generic `String(number)`).
    private mutating func appendDecimal(magnitude: UInt64, negative: Bool) {
        if negative { bytes.append(UInt8(ascii: "-")) }
        // At most 20 digits, written right to left into a stack buffer.
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { digits in
            var v = magnitude
            var at = 20
            repeat {
                at -= 1
                digits[at] = UInt8(truncatingIfNeeded: 48 &+ v % 10)
                v /= 10
            } while v != 0
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: digits[at...]))
        }
    }

    private mutating func appendInteger<I: BinaryInteger>(_ number: I) {
        if let v = Int64(exactly: number) {
            appendDecimal(magnitude: v.magnitude, negative: v < 0)
        } else if let v = UInt64(exactly: number) {
            appendDecimal(magnitude: v, negative: false)
        } else {
            bytes.append(contentsOf: String(number).utf8)
        }
    }

    private mutating func finishValue() { needsComma = true }

    // MARK: Values (in an array, or the whole value)

    /// An object; `body` writes its fields.
    public mutating func object(_ body: (inout JSONBuilder) -> Void) {
        separate()
        bytes.append(UInt8(ascii: "{"))
        needsComma = false
        body(&self)
        bytes.append(UInt8(ascii: "}"))
        finishValue()
    }

    /// An array; `body` writes its elements.
    public mutating func array(_ body: (inout JSONBuilder) -> Void) {
        separate()
        bytes.append(UInt8(ascii: "["))
        needsComma = false
        body(&self)
        bytes.append(UInt8(ascii: "]"))
        finishValue()
    }

    /// A string value.
    public mutating func value(_ string: String) {
        separate()
        appendEscaped(string, to: &bytes)
    }

    /// An integer value.
    public mutating func value<I: BinaryInteger>(_ number: I) {
        separate()
        appendInteger(number)
    }

    /// A value given as its exact JSON bytes.
    public mutating func rawValue<Bytes: Collection>(_ json: Bytes) where Bytes.Element == UInt8 {
        separate()
        bytes.append(contentsOf: json)
    }

    // MARK: Fields (in an object)

    public mutating func field(_ name: StaticString, _ string: String) {
        key(name)
        appendEscaped(string, to: &bytes)
        finishValue()
    }

    public mutating func field<I: BinaryInteger>(_ name: StaticString, _ number: I) {
        key(name)
        appendInteger(number)
        finishValue()
    }

    /// An integer field (the common types without the generic path's witness-table calls).
    public mutating func field(_ name: StaticString, _ number: Int) {
        key(name)
        appendDecimal(magnitude: UInt64(number.magnitude), negative: number < 0)
        finishValue()
    }

    public mutating func field(_ name: StaticString, _ number: UInt64) {
        key(name)
        appendDecimal(magnitude: number, negative: false)
        finishValue()
    }

    public mutating func field(_ name: StaticString, _ number: UInt32) {
        key(name)
        appendDecimal(magnitude: UInt64(number), negative: false)
        finishValue()
    }

    public mutating func field(_ name: StaticString, _ number: Int32) {
        key(name)
        appendDecimal(magnitude: UInt64(number.magnitude), negative: number < 0)
        finishValue()
    }

    public mutating func field(_ name: StaticString, _ flag: Bool) {
        key(name)
        let text: StaticString = flag ? "true" : "false"
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        finishValue()
    }

    /// A field whose value is `null`.
    public mutating func nullField(_ name: StaticString) {
        key(name)
        bytes.append(contentsOf: "null".utf8)
        finishValue()
    }

    /// A field whose value is given as its exact JSON bytes.
    public mutating func rawField<Bytes: Collection>(_ name: StaticString, _ json: Bytes) where Bytes.Element == UInt8 {
        key(name)
        bytes.append(contentsOf: json)
        finishValue()
    }

    /// A field holding an array of strings.
    public mutating func field(_ name: StaticString, strings: [String]) {
        array(name) { a in for s in strings { a.value(s) } }
    }

    /// A field holding an object.
    public mutating func object(_ name: StaticString, _ body: (inout JSONBuilder) -> Void) {
        key(name)
        needsComma = false
        bytes.append(UInt8(ascii: "{"))
        body(&self)
        bytes.append(UInt8(ascii: "}"))
        finishValue()
    }

    /// A field holding an array.
    public mutating func array(_ name: StaticString, _ body: (inout JSONBuilder) -> Void) {
        key(name)
        needsComma = false
        bytes.append(UInt8(ascii: "["))
        body(&self)
        bytes.append(UInt8(ascii: "]"))
        finishValue()
    }

    /// A field whose key is not a literal (e.g. a map keyed by name).
    public mutating func field<I: BinaryInteger>(named name: String, _ number: I) {
        separate()
        appendEscaped(name, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        appendInteger(number)
    }
}
