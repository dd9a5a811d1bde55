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
        bytes.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
        needsComma = false
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
        bytes.append(contentsOf: String(number).utf8)
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
        bytes.append(contentsOf: String(number).utf8)
        finishValue()
    }

    public mutating func field(_ name: StaticString, _ flag: Bool) {
        key(name)
        bytes.append(contentsOf: (flag ? "true" : "false").utf8)
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
        bytes.append(contentsOf: String(number).utf8)
    }
}
