// SPEC §16.6: a state too large for one frame, published in pieces. The root goes as an empty container of its type
// (a `state`), then patches that each fit in a frame add the members (objects) and elements (arrays) in their order;
// a member or element that does not fit alone is added as an empty container first and then filled the same way.
// Applying every patch to the root gives the state back, member order included.

/// A state split into a root and patches (SPEC §16.6).
public struct StatePieces: Sendable, Equatable {
    /// The root: `{}` or `[]`.
    public var root: JSONValue
    /// The patches, in order; each one's compact JSON takes at most the limit it was made with.
    public var patches: [JSONPatch]
}

/// Why a state cannot be split.
public struct StatePiecesError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The value that does not fit alone.
    public var path: JSONPointer
    public var size: Int
    public var limit: Int
    public var description: String {
        "the value at \(path.tokens.isEmpty ? "the root" : path.description) takes \(size) bytes alone, more than a frame holds (\(limit)): it cannot be published"
    }
}

extension JSONValue {
    /// This value as pieces whose patches each take at most `maxPatchBytes` bytes of compact JSON.
    public func pieces(maxPatchBytes: Int) throws(StatePiecesError) -> StatePieces {
        var pieces = StatePieces(root: .null, patches: [])
        var batch: [JSONPatchOperation] = []
        var batchBytes = 2  // "[" and "]"
        func flush() {
            if !batch.isEmpty { pieces.patches.append(JSONPatch(operations: batch)) }
            batch = []
            batchBytes = 2
        }
        func emit(_ op: JSONPatchOperation, size: Int) {
            if !batch.isEmpty, batchBytes + 1 + size > maxPatchBytes { flush() }
            batchBytes += (batch.isEmpty ? 0 : 1) + size
            batch.append(op)
        }
        func fill(_ container: JSONValue, at path: JSONPointer) throws(StatePiecesError) {
            switch container {
            case .object(let members):
                for member in members { try add(member.value, at: path.appending(member.key), as: path.appending(member.key)) }
            case .array(let items):
                for (i, item) in items.enumerated() { try add(item, at: path.appending("-"), as: path.appending(String(i))) }
            default:
                break
            }
        }
        /// Adds `value` at `target` (`-` for an element), `location` being where it ends up.
        func add(_ value: JSONValue, at target: JSONPointer, as location: JSONPointer) throws(StatePiecesError) {
            let op = JSONPatchOperation.add(path: target, value: value)
            let size = op.json.compactBytes.count
            if size + 2 <= maxPatchBytes { return emit(op, size: size) }
            let empty: JSONValue
            switch value {
            case .object: empty = .object([])
            case .array: empty = .array([])
            default: throw StatePiecesError(path: location, size: size, limit: maxPatchBytes)
            }
            let shell = JSONPatchOperation.add(path: target, value: empty)
            let shellSize = shell.json.compactBytes.count
            guard shellSize + 2 <= maxPatchBytes else {
                throw StatePiecesError(path: location, size: shellSize, limit: maxPatchBytes)
            }
            emit(shell, size: shellSize)
            try fill(value, at: location)
        }
        switch self {
        case .object: pieces.root = .object([])
        case .array: pieces.root = .array([])
        default: throw StatePiecesError(path: .root, size: compactBytes.count, limit: maxPatchBytes)
        }
        try fill(self, at: .root)
        flush()
        return pieces
    }
}
