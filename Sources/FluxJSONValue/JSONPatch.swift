// JSON Patch (RFC 6902) over JSONValue: parsing a patch, applying it as a whole or not at all, and writing it.
// SPEC §16.1 is the contract; protocol/vectors/patch.json is the shared set of cases every implementation (this one,
// fluxd's, which is this one, and the Python and Node libraries') passes.
//
// Applying works in place: each operation walks down to its target through `modify`, which takes each container
// out of its enum case while it changes it, so a change deep inside a large state copies nothing that is not on
// its path. An undo log of what each primitive change replaced makes a failing patch leave the value as it was,
// at the cost of the change, not of the value.

import FluxCore

/// One JSON Patch operation (RFC 6902 §4).
public enum JSONPatchOperation: Sendable, Equatable {
    case add(path: JSONPointer, value: JSONValue)
    case remove(path: JSONPointer)
    case replace(path: JSONPointer, value: JSONValue)
    case move(from: JSONPointer, path: JSONPointer)
    case copy(from: JSONPointer, path: JSONPointer)
    case test(path: JSONPointer, value: JSONValue)

    /// The operation's name on the wire.
    public var name: String {
        switch self {
        case .add: "add"
        case .remove: "remove"
        case .replace: "replace"
        case .move: "move"
        case .copy: "copy"
        case .test: "test"
        }
    }

    /// The operation as the JSON object RFC 6902 writes (`op`, then `from`, `path`, `value` as they apply).
    public var json: JSONValue {
        var members: [(key: String, value: JSONValue)] = [("op", .string(name))]
        switch self {
        case .add(let path, let value), .replace(let path, let value), .test(let path, let value):
            members.append(("path", .string(path.description)))
            members.append(("value", value))
        case .remove(let path):
            members.append(("path", .string(path.description)))
        case .move(let from, let path), .copy(let from, let path):
            members.append(("from", .string(from.description)))
            members.append(("path", .string(path.description)))
        }
        return .object(members)
    }
}

/// Why a patch was not applied (or not read). `kind` is the category `protocol/vectors/patch.json` names.
public struct JSONPatchError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The categories of the shared vectors.
    public enum Kind: String, Sendable {
        /// Not an array of operation objects; an unknown or missing `op`; a missing or ill-typed member.
        case invalidOp = "invalid-op"
        /// A `path` or `from` that is not a JSON Pointer.
        case invalidPointer = "invalid-pointer"
        /// A location that must exist does not.
        case notFound = "not-found"
        /// An array index out of range or not written as RFC 6901 allows.
        case index
        /// `move` of a location into one of its own children.
        case moveIntoChild = "move-into-child"
        /// A `test` whose value is not equal.
        case testFailed = "test-failed"
        /// The result would be nested deeper than 64 levels (SPEC §3.2).
        case tooDeep = "too-deep"
        /// The result would be larger than the applier's limit (fluxd: the store's share of the memory budget).
        case tooLarge = "too-large"
    }

    public var kind: Kind
    /// The index of the failing operation in the patch (nil when the patch as a whole is not one).
    public var operation: Int?
    /// What is wrong, for a person.
    public var message: String

    public init(_ kind: Kind, operation: Int? = nil, _ message: String) {
        self.kind = kind
        self.operation = operation
        self.message = message
    }

    public var description: String {
        if let operation { return "operation \(operation): \(message)" }
        return message
    }
}

/// A JSON Patch: operations applied in order, all or none.
public struct JSONPatch: Sendable, Equatable {
    /// The operations, in order.
    public var operations: [JSONPatchOperation]

    /// The deepest a value may be nested (SPEC §3.2: the top-level value is depth 1).
    public static let maxDepth = 64

    public init(operations: [JSONPatchOperation] = []) {
        self.operations = operations
    }

    /// Reads a patch from JSON bytes (an array of operation objects).
    public init<Bytes: Collection>(parsing bytes: Bytes) throws(JSONPatchError) where Bytes.Element == UInt8 {
        let value: JSONValue
        do { value = try JSONValue(parsing: bytes) } catch {
            throw JSONPatchError(.invalidOp, "a patch must be JSON: \(error)")
        }
        try self.init(value)
    }

    /// Reads a patch from its JSON value (an array of operation objects).
    public init(_ value: JSONValue) throws(JSONPatchError) {
        guard let items = value.arrayValue else { throw JSONPatchError(.invalidOp, "a patch is a JSON array of operations") }
        var operations: [JSONPatchOperation] = []
        operations.reserveCapacity(items.count)
        for (n, item) in items.enumerated() {
            operations.append(try Self.operation(item, at: n))
        }
        self.operations = operations
    }

    /// Reads a patch from bytes FluxCore's scanner has already accepted as one JSON value: a field of a message
    /// scanned with `Envelope(body:)` (fluxd and the client scan every frame whole when it arrives). The
    /// operations are read straight from the bytes, without scanning them again or building the patch as a
    /// `JSONValue` first; only each operation's `value` becomes a tree. Same result and same errors as
    /// `init(parsing:)` (a differential test holds them together). Precondition: `bytes` is valid JSON.
    public init(scanned bytes: ArraySlice<UInt8>) throws(JSONPatchError) {
        var reader = ValidJSONReader(bytes: bytes)
        self.operations = try reader.patchOperations()
    }

    /// The members of one operation object that RFC 6902 reads (the last of a repeated one; others are ignored).
    struct Members {
        var op: JSONValue?
        var path: JSONValue?
        var from: JSONValue?
        var value: JSONValue?

        subscript(name: String) -> JSONValue? { name == "path" ? path : from }
    }

    private static func operation(_ item: JSONValue, at n: Int) throws(JSONPatchError) -> JSONPatchOperation {
        guard case .object = item else { throw JSONPatchError(.invalidOp, operation: n, "an operation is a JSON object") }
        return try operation(Members(op: item["op"], path: item["path"], from: item["from"], value: item["value"]), at: n)
    }

    /// The one definition of an operation object's meaning (RFC 6902 §4), whichever way its members were read.
    static func operation(_ item: Members, at n: Int) throws(JSONPatchError) -> JSONPatchOperation {
        guard let op = item.op else { throw JSONPatchError(.invalidOp, operation: n, "\"op\" is missing") }
        guard let name = op.stringValue else { throw JSONPatchError(.invalidOp, operation: n, "\"op\" must be a string") }
        func pointer(_ member: String) throws(JSONPatchError) -> JSONPointer {
            guard let raw = item[member] else { throw JSONPatchError(.invalidOp, operation: n, "\"\(member)\" is missing") }
            guard let text = raw.stringValue else { throw JSONPatchError(.invalidOp, operation: n, "\"\(member)\" must be a string") }
            do { return try JSONPointer(parsing: text) } catch {
                throw JSONPatchError(.invalidPointer, operation: n, "\"\(member)\": \(error.message)")
            }
        }
        func value() throws(JSONPatchError) -> JSONValue {
            guard let value = item.value else { throw JSONPatchError(.invalidOp, operation: n, "\"value\" is missing") }
            return value
        }
        switch name {
        case "add": return .add(path: try pointer("path"), value: try value())
        case "remove": return .remove(path: try pointer("path"))
        case "replace": return .replace(path: try pointer("path"), value: try value())
        case "move": return .move(from: try pointer("from"), path: try pointer("path"))
        case "copy": return .copy(from: try pointer("from"), path: try pointer("path"))
        case "test": return .test(path: try pointer("path"), value: try value())
        default: throw JSONPatchError(.invalidOp, operation: n, "unknown op \"\(name)\"")
        }
    }

    /// The patch as a JSON array.
    public var json: JSONValue { .array(operations.map(\.json)) }

    /// The patch as compact JSON bytes.
    public var compactBytes: [UInt8] { json.compactBytes }

    /// Whether it has no operations (it changes nothing).
    public var isEmpty: Bool { operations.isEmpty }
}

extension JSONValue {
    /// Applies `patch` in place: every operation, in order, or (when one fails) none. Returns the operations as
    /// applied: an `add` whose path ends in `-` with that token replaced by the index the element got (so a
    /// reader of the patch knows which element it made).
    @discardableResult
    public mutating func apply(_ patch: JSONPatch) throws(JSONPatchError) -> [JSONPatchOperation] {
        var undo: [PatchUndo] = []
        var applied = patch.operations
        for (n, operation) in patch.operations.enumerated() {
            do {
                try applyOne(operation, undo: &undo)
            } catch {
                for step in undo.reversed() { revert(step) }
                throw JSONPatchError(error.kind, operation: n, error.message)
            }
            if case .add(let path, let value) = operation, path.tokens.last == "-",
               case .removeElement(_, let index)? = undo.last {
                applied[n] = .add(path: JSONPointer(tokens: path.tokens.dropLast() + [String(index)]), value: value)
            }
        }
        return applied
    }

    /// This value with `patch` applied.
    public func applying(_ patch: JSONPatch) throws(JSONPatchError) -> JSONValue {
        var copy = self
        try copy.apply(patch)
        return copy
    }

    /// How deeply the value nests, counted as SPEC §3.2 counts: each array or object is a level, scalars add
    /// none (`{"a":[[1]]}` is 3, `1` is 0).
    public var depth: Int {
        switch self {
        case .array(let items): return 1 + (items.lazy.map(\.depth).max() ?? 0)
        case .object(let members): return 1 + (members.lazy.map(\.value.depth).max() ?? 0)
        default: return 0
        }
    }

    /// JSON equality (RFC 6902 §4.6): numbers by exact decimal value (`JSONNumber`), objects as unordered sets of members, arrays in order.
    public func jsonEquals(_ other: JSONValue) -> Bool {
        switch (self, other) {
        case (.number(let a), .number(let b)):
            return JSONNumber.exactlyEqual(a, b)
        case (.array(let a), .array(let b)):
            return a.count == b.count && zip(a, b).allSatisfy { $0.jsonEquals($1) }
        case (.object(let a), .object(let b)):
            let keys = Set(a.map { Array($0.key.utf8) })
            guard keys.count == Set(b.map { Array($0.key.utf8) }).count else { return false }
            for utf8 in keys {
                let key = String(decoding: utf8, as: UTF8.self)
                guard let x = self[key], let y = other[key], x.jsonEquals(y) else { return false }
            }
            return true
        default:
            return self == other
        }
    }
}

/// What one primitive change replaced, to put it back.
enum PatchUndo {
    case root(JSONValue)
    case setMember(parent: [String], index: Int, value: JSONValue)
    case removeMember(parent: [String], index: Int)
    case insertMember(parent: [String], index: Int, key: String, value: JSONValue)
    case setElement(parent: [String], index: Int, value: JSONValue)
    case removeElement(parent: [String], index: Int)
    case insertElement(parent: [String], index: Int, value: JSONValue)
}

/// A primitive failure inside one operation (the operation's index is added by `apply`).
private typealias Failure = JSONPatchError

extension JSONValue {
    private mutating func applyOne(_ operation: JSONPatchOperation, undo: inout [PatchUndo]) throws(JSONPatchError) {
        switch operation {
        case .add(let path, let value):
            try checkDepth(path, value)
            try add(path.tokens, value, undo: &undo)
        case .remove(let path):
            _ = try remove(path.tokens, undo: &undo)
        case .replace(let path, let value):
            try checkDepth(path, value)
            try replace(path.tokens, value, undo: &undo)
        case .move(let from, let path):
            if from == path {  // (tokens compared by their bytes: JSONPointer's ==)
                _ = try value(at: from.tokens)  // must exist; moving it onto itself changes nothing
                return
            }
            if path.tokens.count > from.tokens.count, JSONPointer(tokens: Array(path.tokens.prefix(from.tokens.count))) == from {
                throw Failure(.moveIntoChild, "cannot move \(from) into its own child \(path)")
            }
            let moved = try remove(from.tokens, undo: &undo)
            try checkDepth(path, moved)
            try add(path.tokens, moved, undo: &undo)
        case .copy(let from, let path):
            let copied = try value(at: from.tokens)
            try checkDepth(path, copied)
            try add(path.tokens, copied, undo: &undo)
        case .test(let path, let expected):
            let actual = try value(at: path.tokens)
            guard actual.jsonEquals(expected) else {
                throw Failure(.testFailed, "test failed: \(path) is \(actual.compact), not \(expected.compact)")
            }
        }
    }

    private func checkDepth(_ path: JSONPointer, _ value: JSONValue) throws(JSONPatchError) {
        guard path.tokens.count + value.depth <= JSONPatch.maxDepth else {
            throw Failure(.tooDeep, "the value at \(path) would be nested deeper than \(JSONPatch.maxDepth) levels")
        }
    }

    /// The value at `tokens` (a pointer's unescaped tokens), or a `not-found` / `index` error.
    public func value(at tokens: [String]) throws(JSONPatchError) -> JSONValue {
        var current = self
        for (k, token) in tokens.enumerated() {
            switch current {
            case .object(let members):
                guard let member = members.last(where: { sameKey($0.key, token) }) else {
                    throw Failure(.notFound, "\(JSONPointer(tokens: Array(tokens[...k]))) does not exist")
                }
                current = member.value
            case .array(let items):
                let index = try Self.index(token, count: items.count, at: tokens, k)
                current = items[index]
            default:
                throw Failure(.notFound, "\(JSONPointer(tokens: Array(tokens[...k]))) does not exist: its parent is not an object or array")
            }
        }
        return current
    }

    /// An existing element's index: digits, no leading zero, below `count`.
    private static func index(_ token: String, count: Int, at tokens: [String], _ k: Int) throws(JSONPatchError) -> Int {
        guard let index = arrayIndex(token) else {
            throw Failure(.index, "\(JSONPointer(tokens: Array(tokens[...k]))): \"\(token)\" is not an array index")
        }
        guard index < count else {
            throw Failure(.index, "\(JSONPointer(tokens: Array(tokens[...k]))): index \(index) is out of range (\(count) elements)")
        }
        return index
    }

    /// `token` as RFC 6901 writes an array index (`0`, or digits without a leading zero), else nil.
    public static func arrayIndex(_ token: String) -> Int? {
        let utf8 = token.utf8
        guard let first = utf8.first, utf8.count <= 18, first >= UInt8(ascii: "0"), first <= UInt8(ascii: "9") else { return nil }
        if first == UInt8(ascii: "0") { return utf8.count == 1 ? 0 : nil }
        var n = 0
        for c in utf8 {
            guard c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") else { return nil }
            n = n * 10 + Int(c - UInt8(ascii: "0"))
        }
        return n
    }

    /// The container's payload, `.null` left in its place: the caller then holds the only reference, so changing
    /// it copies nothing (a `switch self { case .array(var items): ... }` keeps the switched-on value alive for the
    /// whole case body, and every change would copy the array).
    @inline(__always)
    mutating func takeArray() -> [JSONValue]? {
        let taken: [JSONValue]
        switch self {
        case .array(let items): taken = items
        default: return nil
        }
        self = .null
        return taken
    }

    /// See `takeArray`.
    @inline(__always)
    mutating func takeObject() -> [(key: String, value: JSONValue)]? {
        let taken: [(key: String, value: JSONValue)]
        switch self {
        case .object(let members): taken = members
        default: return nil
        }
        self = .null
        return taken
    }

    /// Runs `body` on the value at `tokens`, in place (each container on the way is taken out of `self` while it
    /// changes, so nothing off the path is copied).
    private mutating func modify(_ tokens: ArraySlice<String>, all: [String],
                                 _ body: (inout JSONValue) throws(JSONPatchError) -> Void) throws(JSONPatchError) {
        guard let token = tokens.first else { return try body(&self) }
        let k = all.count - tokens.count
        if var members = takeObject() {
            defer { self = .object(members) }
            guard let i = members.lastIndex(where: { sameKey($0.key, token) }) else {
                throw Failure(.notFound, "\(JSONPointer(tokens: Array(all[...k]))) does not exist")
            }
            try members[i].value.modify(tokens.dropFirst(), all: all, body)
        } else if var items = takeArray() {
            defer { self = .array(items) }
            let i = try Self.index(token, count: items.count, at: all, k)
            try items[i].modify(tokens.dropFirst(), all: all, body)
        } else {
            throw Failure(.notFound, "\(JSONPointer(tokens: Array(all[...k]))) does not exist: its parent is not an object or array")
        }
    }

    private mutating func add(_ tokens: [String], _ value: JSONValue, undo: inout [PatchUndo]) throws(JSONPatchError) {
        guard let last = tokens.last else {
            undo.append(.root(self))
            self = value
            return
        }
        let parent = Array(tokens.dropLast())
        try modify(parent[...], all: tokens) { (container: inout JSONValue) throws(JSONPatchError) in
            if var members = container.takeObject() {
                defer { container = .object(members) }
                if let i = members.lastIndex(where: { sameKey($0.key, last) }) {
                    undo.append(.setMember(parent: parent, index: i, value: members[i].value))
                    members[i].value = value
                } else {
                    members.append((last, value))
                    undo.append(.removeMember(parent: parent, index: members.count - 1))
                }
            } else if var items = container.takeArray() {
                defer { container = .array(items) }
                let index: Int
                if last == "-" {
                    index = items.count
                } else {
                    guard let i = Self.arrayIndex(last) else {
                        throw Failure(.index, "\(JSONPointer(tokens: tokens)): \"\(last)\" is not an array index")
                    }
                    guard i <= items.count else {
                        throw Failure(.index, "\(JSONPointer(tokens: tokens)): index \(i) is out of range (\(items.count) elements)")
                    }
                    index = i
                }
                items.insert(value, at: index)
                undo.append(.removeElement(parent: parent, index: index))
            } else {
                throw Failure(.notFound, "\(JSONPointer(tokens: parent)) is not an object or array")
            }
        }
    }

    private mutating func remove(_ tokens: [String], undo: inout [PatchUndo]) throws(JSONPatchError) -> JSONValue {
        guard let last = tokens.last else { throw Failure(.invalidOp, "the whole document cannot be removed") }
        let parent = Array(tokens.dropLast())
        var removed = JSONValue.null
        try modify(parent[...], all: tokens) { (container: inout JSONValue) throws(JSONPatchError) in
            if var members = container.takeObject() {
                defer { container = .object(members) }
                guard let i = members.lastIndex(where: { sameKey($0.key, last) }) else {
                    throw Failure(.notFound, "\(JSONPointer(tokens: tokens)) does not exist")
                }
                let member = members.remove(at: i)
                removed = member.value
                undo.append(.insertMember(parent: parent, index: i, key: member.key, value: member.value))
            } else if var items = container.takeArray() {
                defer { container = .array(items) }
                let i = try Self.index(last, count: items.count, at: tokens, tokens.count - 1)
                removed = items.remove(at: i)
                undo.append(.insertElement(parent: parent, index: i, value: removed))
            } else {
                throw Failure(.notFound, "\(JSONPointer(tokens: parent)) is not an object or array")
            }
        }
        return removed
    }

    private mutating func replace(_ tokens: [String], _ value: JSONValue, undo: inout [PatchUndo]) throws(JSONPatchError) {
        guard let last = tokens.last else {
            undo.append(.root(self))
            self = value
            return
        }
        let parent = Array(tokens.dropLast())
        try modify(parent[...], all: tokens) { (container: inout JSONValue) throws(JSONPatchError) in
            if var members = container.takeObject() {
                defer { container = .object(members) }
                guard let i = members.lastIndex(where: { sameKey($0.key, last) }) else {
                    throw Failure(.notFound, "\(JSONPointer(tokens: tokens)) does not exist")
                }
                undo.append(.setMember(parent: parent, index: i, value: members[i].value))
                members[i].value = value
            } else if var items = container.takeArray() {
                defer { container = .array(items) }
                let i = try Self.index(last, count: items.count, at: tokens, tokens.count - 1)
                undo.append(.setElement(parent: parent, index: i, value: items[i]))
                items[i] = value
            } else {
                throw Failure(.notFound, "\(JSONPointer(tokens: parent)) is not an object or array")
            }
        }
    }

    /// Puts back what one primitive change replaced (the containers are known to be there: the change made them).
    private mutating func revert(_ step: PatchUndo) {
        func at(_ parent: [String], _ body: (inout JSONValue) -> Void) {
            try? modify(parent[...], all: parent) { (container: inout JSONValue) throws(JSONPatchError) in body(&container) }
        }
        switch step {
        case .root(let value):
            self = value
        case .setMember(let parent, let index, let value):
            at(parent) { if var m = $0.takeObject() { m[index].value = value; $0 = .object(m) } }
        case .removeMember(let parent, let index):
            at(parent) { if var m = $0.takeObject() { m.remove(at: index); $0 = .object(m) } }
        case .insertMember(let parent, let index, let key, let value):
            at(parent) { if var m = $0.takeObject() { m.insert((key, value), at: index); $0 = .object(m) } }
        case .setElement(let parent, let index, let value):
            at(parent) { if var a = $0.takeArray() { a[index] = value; $0 = .array(a) } }
        case .removeElement(let parent, let index):
            at(parent) { if var a = $0.takeArray() { a.remove(at: index); $0 = .array(a) } }
        case .insertElement(let parent, let index, let value):
            at(parent) { if var a = $0.takeArray() { a.insert(value, at: index); $0 = .array(a) } }
        }
    }
}

extension ValidJSONReader {
    /// A patch's operations, read from the bytes (see `JSONPatch(scanned:)`): the array and each operation object
    /// walked here, the members RFC 6902 reads kept, the meaning given by `JSONPatch.operation(_:at:)`.
    mutating func patchOperations() throws(JSONPatchError) -> [JSONPatchOperation] {
        skipSpace()
        guard bytes[i] == UInt8(ascii: "[") else { throw JSONPatchError(.invalidOp, "a patch is a JSON array of operations") }
        i += 1
        skipSpace()
        var operations: [JSONPatchOperation] = []
        if bytes[i] == UInt8(ascii: "]") { return operations }
        while true {
            skipSpace()
            let n = operations.count
            guard bytes[i] == UInt8(ascii: "{") else {
                throw JSONPatchError(.invalidOp, operation: n, "an operation is a JSON object")
            }
            i += 1
            var members = JSONPatch.Members()
            skipSpace()
            if bytes[i] == UInt8(ascii: "}") {
                i += 1
            } else {
                while true {
                    skipSpace()
                    let key = stringToken()
                    skipSpace()
                    i += 1  // ':'
                    switch Self.member(key) {
                    case 1: members.op = value()
                    case 2: members.path = value()
                    case 3: members.from = value()
                    case 4: members.value = value()
                    default: _ = value()
                    }
                    skipSpace()
                    let separator = bytes[i]
                    i += 1
                    if separator == UInt8(ascii: "}") { break }
                }
            }
            operations.append(try JSONPatch.operation(members, at: n))
            skipSpace()
            let separator = bytes[i]
            i += 1
            if separator == UInt8(ascii: "]") { return operations }
        }
    }

    /// Which member a key token names: 1 `op`, 2 `path`, 3 `from`, 4 `value`, 0 another (compared as written, or
    /// decoded when the key has an escape).
    static func member(_ token: ArraySlice<UInt8>) -> Int {
        if token.contains(UInt8(ascii: "\\")) {
            switch decodeJSONString(token) {
            case "op": return 1
            case "path": return 2
            case "from": return 3
            case "value": return 4
            default: return 0
            }
        }
        let inner = token.dropFirst().dropLast()
        switch inner.count {
        case 2: return inner.elementsEqual("op".utf8) ? 1 : 0
        case 4: return inner.elementsEqual("path".utf8) ? 2 : (inner.elementsEqual("from".utf8) ? 3 : 0)
        case 5: return inner.elementsEqual("value".utf8) ? 4 : 0
        default: return 0
        }
    }
}
