/// One path-level change between two JSON values.
public struct JSONChange: Sendable, Equatable {
    /// The JSON Patch (RFC 6902) operation.
    public enum Kind: String, Sendable { case add, remove, replace }
    /// What happens at `path`.
    public var kind: Kind
    /// Where.
    public var path: JSONPointer
    /// The value before (`remove`, `replace`).
    public var old: JSONValue?
    /// The value after (`add`, `replace`).
    public var new: JSONValue?

    public init(kind: Kind, path: JSONPointer, old: JSONValue? = nil, new: JSONValue? = nil) {
        self.kind = kind
        self.path = path
        self.old = old
        self.new = new
    }
}

extension JSONValue {
    /// The changes that turn this value into `new` (see `diff`), paths relative to this value.
    public func changes(to new: JSONValue) -> [JSONChange] {
        diff(self, new, at: .root)
    }
}

/// The changes that turn `old` into `new`: objects member by member; arrays by their common prefix and suffix, so
/// one inserted or removed element is one `add` or `remove`; anything else is a `replace` at the deepest path.
func diff(_ old: JSONValue, _ new: JSONValue, at path: JSONPointer) -> [JSONChange] {
    if old == new { return [] }
    switch (old, new) {
    case (.object(let a), .object(let b)):
        var changes: [JSONChange] = []
        for member in a {
            if let other = b.last(where: { sameKey($0.key, member.key) }) {
                changes += diff(member.value, other.value, at: path.appending(member.key))
            } else {
                changes.append(JSONChange(kind: .remove, path: path.appending(member.key), old: member.value))
            }
        }
        for member in b where !a.contains(where: { sameKey($0.key, member.key) }) {
            changes.append(JSONChange(kind: .add, path: path.appending(member.key), new: member.value))
        }
        return changes
    case (.array(let a), .array(let b)):
        var prefix = 0
        while prefix < min(a.count, b.count), a[prefix] == b[prefix] { prefix += 1 }
        var suffix = 0
        while suffix < min(a.count, b.count) - prefix, a[a.count - 1 - suffix] == b[b.count - 1 - suffix] { suffix += 1 }
        let oldMiddle = Array(a[prefix..<(a.count - suffix)])
        let newMiddle = Array(b[prefix..<(b.count - suffix)])
        var changes: [JSONChange] = []
        let common = min(oldMiddle.count, newMiddle.count)
        for k in 0..<common {
            changes += diff(oldMiddle[k], newMiddle[k], at: path.appending(String(prefix + k)))
        }
        // Removals from the highest index down, so applying them in order keeps the indices right.
        for k in stride(from: oldMiddle.count - 1, through: common, by: -1) {
            changes.append(JSONChange(kind: .remove, path: path.appending(String(prefix + k)), old: oldMiddle[k]))
        }
        for k in common..<max(common, newMiddle.count) {
            changes.append(JSONChange(kind: .add, path: path.appending(String(prefix + k)), new: newMiddle[k]))
        }
        return changes
    default:
        return [JSONChange(kind: .replace, path: path, old: old, new: new)]
    }
}

extension JSONValue {
    /// A JSON Patch (RFC 6902) that turns this value into `new`: `changes(to:)` as operations, in an order that
    /// applies (array removals from the highest index down, then additions). Empty when the values are equal.
    public func diffPatch(to new: JSONValue) -> JSONPatch {
        JSONPatch(operations: changes(to: new).map { change in
            switch change.kind {
            case .add: .add(path: change.path, value: change.new ?? .null)
            case .remove: .remove(path: change.path)
            case .replace: .replace(path: change.path, value: change.new ?? .null)
            }
        })
    }
}
