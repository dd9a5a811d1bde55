// JSON Patch (RFC 6902, SPEC §16.1) applied to a JSONTree: the same meaning as `JSONValue.apply` (the reference,
// held to this one by a differential test), at O(log n) node visits per path token, with the result's size and
// depth checked after every operation from the summaries (O(1)), never by walking what an operation made.
//
// All or nothing for free: the tree as it was is kept (one reference) while the patch applies; every change then
// copies the few nodes on its path, and a failure puts the old root back.

/// What applying a patch to a `JSONTree` may make, and what it did.
public struct TreePatchLimits: Sendable {
    /// The largest rendered size the state may reach, after any operation.
    public var maxBytes: Int
    public init(maxBytes: Int = TreeSummary.saturated) { self.maxBytes = maxBytes }
}

extension JSONTree {
    /// Applies `patch` in place, every operation in order or (when one fails) none; returns the operations as
    /// applied (an `add` at `-` with the index it made). `steps` counts the tree nodes visited: O(ops · log n) for
    /// any patch (the unit tests hold it to that).
    @discardableResult
    public mutating func apply(_ patch: JSONPatch, limits: TreePatchLimits = TreePatchLimits(),
                               steps: inout Int) throws(JSONPatchError) -> [JSONPatchOperation] {
        let before = self  // (shares everything: changes below copy their paths)
        var applied = patch.operations
        for (n, operation) in patch.operations.enumerated() {
            do throws(JSONPatchError) {
                if let index = try applyOne(operation, steps: &steps), case .add(let path, let value) = operation {
                    applied[n] = .add(path: JSONPointer(tokens: path.tokens.dropLast() + [String(index)]), value: value)
                }
                guard byteCount <= limits.maxBytes else {
                    throw JSONPatchError(.tooLarge, "the state would take \(byteCount) bytes, over the \(limits.maxBytes) it may")
                }
            } catch {
                self = before
                throw JSONPatchError(error.kind, operation: n, error.message)
            }
        }
        return applied
    }

    /// Applies `patch` (see `apply(_:limits:steps:)`).
    @discardableResult
    public mutating func apply(_ patch: JSONPatch, limits: TreePatchLimits = TreePatchLimits()) throws(JSONPatchError) -> [JSONPatchOperation] {
        var steps = 0
        return try apply(patch, limits: limits, steps: &steps)
    }

    /// One operation; returns the index an `add` at `-` made.
    private mutating func applyOne(_ operation: JSONPatchOperation, steps: inout Int) throws(JSONPatchError) -> Int? {
        switch operation {
        case .add(let path, let value):
            let tree = JSONTree(value)
            try Self.checkDepth(path, tree)
            return try add(path.tokens, tree, steps: &steps)
        case .remove(let path):
            _ = try remove(path.tokens, steps: &steps)
        case .replace(let path, let value):
            let tree = JSONTree(value)
            try Self.checkDepth(path, tree)
            try replace(path.tokens, tree, steps: &steps)
        case .move(let from, let path):
            if Self.sameTokens(from.tokens[...], path.tokens[...]) {
                _ = try value(at: from.tokens[...], all: from.tokens, steps: &steps)  // must exist; moving it onto itself changes nothing
                return nil
            }
            if path.tokens.count > from.tokens.count, Self.sameTokens(path.tokens.prefix(from.tokens.count), from.tokens[...]) {
                throw JSONPatchError(.moveIntoChild, "cannot move \(from) into its own child \(path)")
            }
            let moved = try remove(from.tokens, steps: &steps)
            try Self.checkDepth(path, moved)
            _ = try add(path.tokens, moved, steps: &steps)
        case .copy(let from, let path):
            let copied = try value(at: from.tokens[...], all: from.tokens, steps: &steps)  // shared, not walked
            try Self.checkDepth(path, copied)
            _ = try add(path.tokens, copied, steps: &steps)
        case .test(let path, let expected):
            let actual = try value(at: path.tokens[...], all: path.tokens, steps: &steps)
            guard actual.jsonEquals(expected, steps: &steps) else {
                throw JSONPatchError(.testFailed, "test failed: \(path) is \(Self.excerpt(actual)), not \(expected.compact)")
            }
        }
        return nil
    }

    /// Whether two token lists are the same, token by token, by their bytes (SPEC §3.2).
    static func sameTokens(_ a: ArraySlice<String>, _ b: ArraySlice<String>) -> Bool {
        a.count == b.count && zip(a, b).allSatisfy { sameKey($0, $1) }
    }

    /// The value's rendering for an error message, cut to 200 bytes (a `test` against a large subtree must not
    /// render it).
    static func excerpt(_ value: JSONTree) -> String {
        if value.byteCount <= 200 { return String(decoding: value.compactBytes, as: UTF8.self) }
        return "a value of \(value.byteCount) bytes"
    }

    private static func checkDepth(_ path: JSONPointer, _ value: JSONTree) throws(JSONPatchError) {
        guard path.tokens.count + value.depth <= JSONPatch.maxDepth else {
            throw JSONPatchError(.tooDeep, "the value at \(path) would be nested deeper than \(JSONPatch.maxDepth) levels")
        }
    }

    /// Takes the value out of `self` (leaving a scalar in its place) so the caller holds its only reference.
    @inline(__always)
    private mutating func take() -> JSONTree {
        let taken = self
        self = .scalar("null")
        return taken
    }

    /// Runs `body` on the value at `tokens`, in place (each container on the way is taken out of `self` while it
    /// changes, so only shared nodes on the path are copied).
    private mutating func modify(_ tokens: ArraySlice<String>, all: [String], steps: inout Int,
                                 _ body: (inout JSONTree) throws(JSONPatchError) -> Void) throws(JSONPatchError) {
        guard let token = tokens.first else { return try body(&self) }
        let k = all.count - tokens.count
        switch take() {
        case .object(var members):
            defer { self = .object(members) }
            guard let p = members.position(of: Self.quoted(token), steps: &steps) else {
                throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(all[...k]))) does not exist")
            }
            steps += members.list.levels
            try members.list.update(at: p) { (member: inout TreeMember) throws(JSONPatchError) in
                try member.value.modify(tokens.dropFirst(), all: all, steps: &steps, body)
            }
        case .array(var items):
            defer { self = .array(items) }
            let i = try Self.index(token, count: items.count, at: all, k)
            steps += items.levels
            try items.update(at: i) { (item: inout JSONTree) throws(JSONPatchError) in
                try item.modify(tokens.dropFirst(), all: all, steps: &steps, body)
            }
        case let scalar:
            self = scalar
            throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(all[...k]))) does not exist: its parent is not an object or array")
        }
    }

    /// `add`: returns the index an array insertion made.
    private mutating func add(_ tokens: [String], _ value: JSONTree, steps: inout Int) throws(JSONPatchError) -> Int? {
        guard let last = tokens.last else {
            self = value
            return nil
        }
        var made: Int?
        var inner = 0  // (the body's own count: `steps` is in use by `modify` meanwhile)
        defer { steps += inner }
        try modify(tokens.dropLast(), all: tokens, steps: &steps) { (container: inout JSONTree) throws(JSONPatchError) in
            switch container.take() {
            case .object(var members):
                defer { container = .object(members) }
                let key = Self.quoted(last)
                if let p = members.position(of: key, steps: &inner) {
                    inner += members.list.levels
                    members.list.update(at: p) { $0.value = value }
                } else {
                    inner += members.list.levels
                    members.append(key: key, value: value)
                }
            case .array(var items):
                defer { container = .array(items) }
                let index: Int
                if last == "-" {
                    index = items.count
                } else {
                    guard let i = JSONValue.arrayIndex(last) else {
                        throw JSONPatchError(.index, "\(JSONPointer(tokens: tokens)): \"\(last)\" is not an array index")
                    }
                    guard i <= items.count else {
                        throw JSONPatchError(.index, "\(JSONPointer(tokens: tokens)): index \(i) is out of range (\(items.count) elements)")
                    }
                    index = i
                }
                inner += items.levels
                items.insert(value, at: index)
                made = index
            case let scalar:
                container = scalar
                throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(tokens.dropLast()))) is not an object or array")
            }
        }
        return last == "-" ? made : nil
    }

    private mutating func remove(_ tokens: [String], steps: inout Int) throws(JSONPatchError) -> JSONTree {
        guard let last = tokens.last else { throw JSONPatchError(.invalidOp, "the whole document cannot be removed") }
        var removed = JSONTree.scalar("null")
        var inner = 0  // (the body's own count: `steps` is in use by `modify` meanwhile)
        defer { steps += inner }
        try modify(tokens.dropLast(), all: tokens, steps: &steps) { (container: inout JSONTree) throws(JSONPatchError) in
            switch container.take() {
            case .object(var members):
                defer { container = .object(members) }
                guard let p = members.position(of: Self.quoted(last), steps: &inner) else {
                    throw JSONPatchError(.notFound, "\(JSONPointer(tokens: tokens)) does not exist")
                }
                inner += members.list.levels
                removed = members.remove(at: p).value
            case .array(var items):
                defer { container = .array(items) }
                let i = try Self.index(last, count: items.count, at: tokens, tokens.count - 1)
                inner += items.levels
                removed = items.remove(at: i)
            case let scalar:
                container = scalar
                throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(tokens.dropLast()))) is not an object or array")
            }
        }
        return removed
    }

    private mutating func replace(_ tokens: [String], _ value: JSONTree, steps: inout Int) throws(JSONPatchError) {
        guard let last = tokens.last else {
            self = value
            return
        }
        var inner = 0  // (the body's own count: `steps` is in use by `modify` meanwhile)
        defer { steps += inner }
        try modify(tokens.dropLast(), all: tokens, steps: &steps) { (container: inout JSONTree) throws(JSONPatchError) in
            switch container.take() {
            case .object(var members):
                defer { container = .object(members) }
                guard let p = members.position(of: Self.quoted(last), steps: &inner) else {
                    throw JSONPatchError(.notFound, "\(JSONPointer(tokens: tokens)) does not exist")
                }
                inner += members.list.levels
                members.list.update(at: p) { $0.value = value }
            case .array(var items):
                defer { container = .array(items) }
                let i = try Self.index(last, count: items.count, at: tokens, tokens.count - 1)
                inner += items.levels
                items.update(at: i) { $0 = value }
            case let scalar:
                container = scalar
                throw JSONPatchError(.notFound, "\(JSONPointer(tokens: Array(tokens.dropLast()))) is not an object or array")
            }
        }
    }
}
