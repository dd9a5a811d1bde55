// The store side of SPEC §16: a change of a state described as an RFC 6902 patch without encoding the whole state.

import Foundation

/// Describes each new value of a state as a JSON Patch (RFC 6902) from the value it described before, without
/// encoding the whole state when its large parts are `TrackedArray`s.
///
/// It walks the state as an `Encoder`, knowing each value's place (its JSON Pointer). A `TrackedArray` is not
/// encoded: the encoder asks it for the changes logged since the content it saw last time (`replace`, `add` and
/// `remove` of single elements), or, when its log does not reach back that far (many changes, or another array
/// assigned in its place), replaces it whole. Everything else (the small, untracked parts) is encoded and compared
/// with what was encoded last time, member by member and element by element. So the cost is that of the untracked
/// parts plus the changed elements.
///
/// The guarantee (checked by a randomized differential test): applying the patch to the JSON of the previous value
/// (as `FluxJSON.encode`, Foundation's JSONEncoder, writes it) gives the JSON of the new value, compared as JSON
/// values.
///
///     var delta = JSONDeltaEncoder()
///     try delta.setBaseline(state)               // the value fluxd holds
///     state.todos[3].done = true
///     let change = try delta.change(to: state)   // [{"op":"replace","path":"/todos/3","value":{...}}]
///     delta.commit(change)                       // once it was sent
public struct JSONDeltaEncoder {
    /// A computed change, to be committed once sent.
    public struct Change {
        /// The patch as compact JSON bytes: an array of `{"op":...,"path":...,"value":...}` objects, written while
        /// the values were compared (no tree of operations in between).
        public let bytes: [UInt8]
        /// How many operations the patch has.
        public let count: Int
        let node: EncodedNode

        /// The patch operations, in order (read back from `bytes`).
        public var operations: [JSONValue] {
            guard count > 0, let parsed = try? JSONValue(parsing: bytes), let items = parsed.arrayValue else { return [] }
            return items
        }

        /// Whether the value did not change.
        public var isEmpty: Bool { count == 0 }

    }

    /// A value encoded whole by the same walk as a change (see `whole(_:capacity:)`).
    public struct Whole {
        /// The value as compact JSON bytes (members in key order, as the patches write them).
        public let bytes: [UInt8]
        let node: EncodedNode
    }

    /// `value` encoded whole, without comparing it with the baseline: for a publisher that sends a small state
    /// whole rather than as a patch. `commit(_:)` then makes it the baseline of the next change.
    public func whole<T: Encodable>(_ value: T, capacity: Int = 256) throws -> Whole {
        let node = try ValueWalker.encode(value, codingPath: [], tracking: true)
        var out: [UInt8] = []
        out.reserveCapacity(capacity)
        try node.appendCompact(to: &out)
        return Whole(bytes: out, node: node)
    }

    /// Makes the value sent whole the baseline.
    public mutating func commit(_ whole: Whole) {
        previous = whole.node
    }

    var previous: EncodedNode?

    /// An encoder with no baseline yet (`change(to:)` then answers nil).
    public init() {}

    /// Whether a baseline is set.
    public var hasBaseline: Bool { previous != nil }

    /// Makes `value` the value the next change starts from (e.g. the state adopted from fluxd). Cheap for tracked
    /// arrays: only their stamps are kept.
    public mutating func setBaseline<T: Encodable>(_ value: T) throws {
        previous = try ValueWalker.encode(value, codingPath: [], tracking: true)
    }

    /// Forgets the baseline.
    public mutating func forgetBaseline() { previous = nil }

    /// The change from the baseline to `value`; nil without a baseline. The baseline stays until `commit`.
    public func change<T: Encodable>(to value: T) throws -> Change? {
        guard let previous else { return nil }
        let node = try ValueWalker.encode(value, codingPath: [], tracking: true)
        var patch = PatchWriter()
        try Self.diff(previous, node, at: nil, into: &patch)
        return Change(bytes: patch.finish(), count: patch.count, node: node)
    }

    /// Makes the value of `change` the baseline.
    public mutating func commit(_ change: Change) {
        previous = change.node
    }

    /// Where a value is: a JSON Pointer as a chain of tokens, each on the stack of the diff that visits it (the
    /// pointer is written out only for an operation, and a visit that finds nothing changed allocates nothing).
    struct PathLink {
        let parent: UnsafePointer<PathLink>?
        /// An object member's key, or nil for the array index `index`.
        let key: String?
        let index: Int
    }

    /// The patch being written.
    struct PatchWriter {
        var bytes: [UInt8] = []
        var count = 0

        mutating func op(_ name: StaticString, at path: UnsafePointer<PathLink>?, value: JSONValue?) {
            if count == 0 {
                bytes.reserveCapacity(96)
                bytes.append(UInt8(ascii: "["))
            } else {
                bytes.append(UInt8(ascii: ","))
            }
            count += 1
            JSONValue.append(#"{"op":""#, to: &bytes)
            JSONValue.append(name, to: &bytes)
            JSONValue.append(#"","path":""#, to: &bytes)
            if let path { Self.write(path, to: &bytes) }
            bytes.append(UInt8(ascii: "\""))
            if let value {
                JSONValue.append(#","value":"#, to: &bytes)
                value.appendCompact(to: &bytes)
            }
            bytes.append(UInt8(ascii: "}"))
        }

        /// The pointer's tokens, root first, each `/` + the token (`~` as `~0`, `/` as `~1`), escaped for a JSON
        /// string.
        static func write(_ link: UnsafePointer<PathLink>, to out: inout [UInt8]) {
            if let parent = link.pointee.parent { write(parent, to: &out) }
            out.append(UInt8(ascii: "/"))
            guard let key = link.pointee.key else {
                out.append(contentsOf: String(link.pointee.index).utf8)
                return
            }
            var plain = true
            for c in key.utf8 where c < 0x20 || c == UInt8(ascii: "~") || c == UInt8(ascii: "/")
                || c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") {
                plain = false
                break
            }
            if plain {
                out.append(contentsOf: key.utf8)
                return
            }
            var token: [UInt8] = []
            for c in key.utf8 {
                switch c {
                case UInt8(ascii: "~"): token.append(UInt8(ascii: "~")); token.append(UInt8(ascii: "0"))
                case UInt8(ascii: "/"): token.append(UInt8(ascii: "~")); token.append(UInt8(ascii: "1"))
                default: token.append(c)
                }
            }
            // As the middle of a JSON string: quoted, then without its quotes.
            var quoted: [UInt8] = []
            token.withUnsafeBufferPointer { JSONValue.appendQuoted(bytes: $0, to: &quoted) }
            out.append(contentsOf: quoted[1..<(quoted.count - 1)])
        }

        mutating func finish() -> [UInt8] {
            if count == 0 { return Array("[]".utf8) }
            bytes.append(UInt8(ascii: "]"))
            return bytes
        }
    }

    /// Writes the operations that turn `old` into `new` (at `path`) into `patch`.
    static func diff(_ old: EncodedNode, _ new: EncodedNode, at path: UnsafePointer<PathLink>?,
                     into patch: inout PatchWriter) throws {
        // One switch per side (a switch over the pair copied both nodes first).
        switch old {
        case .value(let x):
            guard case .value(let y) = new else { break }
            if x != y { patch.op("replace", at: path, value: y) }
            return
        case .object(let a):
            guard case .object(let b) = new else { break }
            // Both sorted by key: merge.
            var i = 0, j = 0
            while i < a.count || j < b.count {
                if j == b.count || (i < a.count && a[i].key < b[j].key) {
                    var link = PathLink(parent: path, key: a[i].key, index: 0)
                    withUnsafePointer(to: &link) { patch.op("remove", at: $0, value: nil) }
                    i += 1
                } else if i == a.count || b[j].key < a[i].key {
                    var link = PathLink(parent: path, key: b[j].key, index: 0)
                    let value = try b[j].node.materialize()
                    withUnsafePointer(to: &link) { patch.op("add", at: $0, value: value) }
                    j += 1
                } else {
                    var link = PathLink(parent: path, key: a[i].key, index: 0)
                    try withUnsafePointer(to: &link) { try diff(a[i].node, b[j].node, at: $0, into: &patch) }
                    i += 1
                    j += 1
                }
            }
            return
        case .array(let a):
            guard case .array(let b) = new else { break }
            let common = min(a.count, b.count)
            for k in 0..<common {
                var link = PathLink(parent: path, key: nil, index: k)
                try withUnsafePointer(to: &link) { try diff(a[k], b[k], at: $0, into: &patch) }
            }
            if a.count > b.count {
                for k in stride(from: a.count - 1, through: b.count, by: -1) {
                    var link = PathLink(parent: path, key: nil, index: k)
                    withUnsafePointer(to: &link) { patch.op("remove", at: $0, value: nil) }
                }
            } else {
                for k in common..<b.count {
                    var link = PathLink(parent: path, key: nil, index: k)
                    let value = try b[k].materialize()
                    withUnsafePointer(to: &link) { patch.op("add", at: $0, value: value) }
                }
            }
            return
        case .tracked(let a):
            guard case .tracked(let b) = new else { break }
            if a.stamp == b.stamp { return }
            guard let changes = try b.changes(a.stamp) else {
                patch.op("replace", at: path, value: try b.materialize())
                return
            }
            for c in changes {
                switch c {
                case .set(let i, let v):
                    var link = PathLink(parent: path, key: nil, index: i)
                    withUnsafePointer(to: &link) { patch.op("replace", at: $0, value: v) }
                case .insert(let i, let v):
                    var link = PathLink(parent: path, key: nil, index: i)
                    withUnsafePointer(to: &link) { patch.op("add", at: $0, value: v) }
                case .remove(let i):
                    var link = PathLink(parent: path, key: nil, index: i)
                    withUnsafePointer(to: &link) { patch.op("remove", at: $0, value: nil) }
                }
            }
            return
        }
        // Another kind of value: replaced whole.
        patch.op("replace", at: path, value: try new.materialize())
    }
}
