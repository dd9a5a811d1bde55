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
        /// The patch operations, in order (`{"op":...,"path":...,"value":...}` objects).
        public var operations: [JSONValue]
        let node: EncodedNode

        /// Whether the value did not change.
        public var isEmpty: Bool { operations.isEmpty }

        /// The patch as compact JSON bytes (an array of the operations).
        public var bytes: [UInt8] { JSONValue.array(operations).compactBytes }
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
        var ops: [JSONValue] = []
        try Self.diff(previous, node, path: "", into: &ops)
        return Change(operations: ops, node: node)
    }

    /// Makes the value of `change` the baseline.
    public mutating func commit(_ change: Change) {
        previous = change.node
    }

    static func op(_ name: String, _ path: String, _ value: JSONValue?) -> JSONValue {
        var members: [(key: String, value: JSONValue)] = [("op", .string(name)), ("path", .string(path))]
        if let value { members.append(("value", value)) }
        return .object(members)
    }

    static func diff(_ old: EncodedNode, _ new: EncodedNode, path: String, into ops: inout [JSONValue]) throws {
        switch (old, new) {
        case (.tracked(let a), .tracked(let b)):
            if a.stamp == b.stamp { return }
            guard let changes = try b.changes(a.stamp) else {
                ops.append(op("replace", path, try b.materialize()))
                return
            }
            for c in changes {
                switch c {
                case .set(let i, let v): ops.append(op("replace", "\(path)/\(i)", v))
                case .insert(let i, let v): ops.append(op("add", "\(path)/\(i)", v))
                case .remove(let i): ops.append(op("remove", "\(path)/\(i)", nil))
                }
            }
        case (.object(let a), .object(let b)):
            // Both sorted by key: merge.
            var i = 0, j = 0
            while i < a.count || j < b.count {
                if j == b.count || (i < a.count && a[i].key < b[j].key) {
                    ops.append(op("remove", path + "/" + escapeToken(a[i].key), nil))
                    i += 1
                } else if i == a.count || b[j].key < a[i].key {
                    ops.append(op("add", path + "/" + escapeToken(b[j].key), try b[j].node.materialize()))
                    j += 1
                } else {
                    try diff(a[i].node, b[j].node, path: path + "/" + escapeToken(a[i].key), into: &ops)
                    i += 1
                    j += 1
                }
            }
        case (.array(let a), .array(let b)):
            let common = min(a.count, b.count)
            for k in 0..<common { try diff(a[k], b[k], path: "\(path)/\(k)", into: &ops) }
            if a.count > b.count {
                for k in stride(from: a.count - 1, through: b.count, by: -1) { ops.append(op("remove", "\(path)/\(k)", nil)) }
            } else {
                for k in common..<b.count { ops.append(op("add", "\(path)/\(k)", try b[k].materialize())) }
            }
        case (.value(let x), .value(let y)):
            if x != y { ops.append(op("replace", path, y)) }
        default:
            ops.append(op("replace", path, try new.materialize()))
        }
    }

    /// A reference token escaped for a JSON Pointer (`~` as `~0`, `/` as `~1`).
    static func escapeToken(_ token: String) -> String {
        guard token.utf8.contains(where: { $0 == UInt8(ascii: "~") || $0 == UInt8(ascii: "/") }) else { return token }
        return token.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1")
    }
}
