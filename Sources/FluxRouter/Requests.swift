import FluxCore

// Decoding and validation of every message a peer sends (SPEC §4, §8): each request type reads its fields from
// the envelope and enforces every rule SPEC.md and protocol/schemas state for them, so the semantics (Router.swift)
// work on values that are known valid. A violation is a `Refusal`: the error code SPEC §11 gives, a message that
// names the field and what was expected, and the `ref` (SPEC §8.9). Payloads, states, queries and errors are not
// decoded: they stay the exact bytes the sender wrote (SPEC §1).

/// Why a request is refused before its semantics run.
struct Refusal: Error {
    var code: ErrorCode
    var message: String
    /// The `ref` of the error; nil: the request's `id` if it is a string, else its `store` (SPEC §8.9).
    var ref: String?
    /// Whether the connection is closed (a bad `hello` closes it, SPEC §6).
    var fatal = false

    static func badMessage(_ message: String, ref: String? = nil) -> Refusal {
        Refusal(code: .badMessage, message: message, ref: ref)
    }
}

/// The field rules shared by the requests: each reader names the field and what it expected.
struct FieldReader {
    let env: Envelope
    let op: StaticString

    /// An optional id (SPEC §4.2): a string of 1-256 bytes decoded. Returns its exact token too (echoed in
    /// replies byte for byte).
    func id(required: Bool) throws(Refusal) -> (text: String, raw: ArraySlice<UInt8>)? {
        switch env.string(.id) {
        case .absent:
            if required { throw .badMessage("\(op) needs an \"id\": a string of 1 to \(Names.maxIDBytes) bytes") }
            return nil
        case .value(let id) where Names.isValidID(id):
            return (id, env.raw(.id)!)
        default:
            throw .badMessage("\"id\" must be a string of 1 to \(Names.maxIDBytes) bytes")
        }
    }

    /// A required store name (SPEC §4.1).
    func store(ref: String? = nil) throws(Refusal) -> String {
        switch env.string(.store) {
        case .value(let name) where Names.isValidStore(name): return name
        case .absent: throw .badMessage("\(op) needs \"store\": a store name", ref: ref)
        default: throw .badMessage("\"store\" must be a store name: 1 to \(Names.maxStoreBytes) bytes of A-Z a-z 0-9 . _ : / -", ref: ref)
        }
    }

    /// A required sequence number (1 ... 2^53-1, SPEC §4.3).
    @inline(__always)
    func seq(ref: @autoclosure () -> String?) throws(Refusal) -> UInt64 {
        switch env.int(.seq) {
        case .value(let n) where Names.isValidInteger(n, positive: true): return UInt64(n)
        case .absent: throw .badMessage("\(op) needs \"seq\": the seq of the action it answers", ref: ref())
        default: throw .badMessage("\"seq\" must be an integer from 1 to 2^53-1", ref: ref())
        }
    }

    /// An optional boolean.
    func bool(_ key: String, ref: String? = nil) throws(Refusal) -> Bool? {
        switch env.bool(key) {
        case .absent: return nil
        case .value(let b): return b
        case .wrongType: throw .badMessage("\"\(key)\" must be a boolean", ref: ref)
        }
    }

    /// A state value (SPEC §3.3: any JSON value, `null` included): its span, nil when absent.
    func state() -> JSONSpan? { env.span(.state) }

    /// An optional array of strings, each checked by `valid`.
    func names(_ key: String, ref: String?, what: String, _ valid: (String) -> Bool) throws(Refusal) -> [String]? {
        switch env.stringArray(key) {
        case .absent: return nil
        case .value(let items) where items.allSatisfy(valid): return items
        default: throw .badMessage("\"\(key)\" must be an array of \(what)", ref: ref)
        }
    }
}

/// `hello` (SPEC §8.1). Every refusal closes the connection.
struct HelloRequest {
    var version: Int64
    var role: Role
    var name: String
    var heartbeat: Bool
    /// `session` (SPEC §15.4): its raw JSON string.
    var session: ArraySlice<UInt8>?

    init(_ env: Envelope) throws(Refusal) {
        func fatal(_ message: String) -> Refusal { Refusal(code: .badMessage, message: message, fatal: true) }
        guard case .value(let version) = env.int("protocol"), Names.isValidInteger(version) else {
            throw fatal("hello needs \"protocol\": an integer (this fluxd speaks \(fluxProtocolVersion))")
        }
        // Checked before anything else: a peer of another version may spell the rest differently (SPEC §6).
        guard version == Int64(fluxProtocolVersion) else {
            throw Refusal(code: .unsupportedVersion,
                          message: "protocol \(version) is not supported; this fluxd speaks protocol \(fluxProtocolVersion)",
                          fatal: true)
        }
        guard case .value(let roleName) = env.string("role"), let role = Role(rawValue: roleName) else {
            throw fatal("hello needs \"role\": \"client\", \"store\" or \"monitor\"")
        }
        switch env.string("name") {
        case .value(let n) where Names.isValidPeerName(n): name = n
        case .absent: name = ""
        default: throw fatal("\"name\" must be a string of at most \(Names.maxPeerNameBytes) bytes")
        }
        switch env.bool("heartbeat") {
        case .value(let h): heartbeat = h
        case .absent: heartbeat = false
        case .wrongType: throw fatal("\"heartbeat\" must be a boolean")
        }
        switch env.string("session") {
        case .absent: session = nil
        case .value(let s) where Names.isValidID(s): session = env.raw("session")
        default: throw fatal("\"session\" must be a string of 1 to \(Names.maxIDBytes) bytes")
        }
        self.version = version
        self.role = role
    }
}

/// `register` (SPEC §8.2).
struct RegisterRequest {
    /// The message (the initial state is a span of it).
    var body: [UInt8]
    var store: String
    var handles: [String]
    var waitFor: [String]
    var queryDeltas: Bool
    /// The initial state's span (used when fluxd retains no snapshot of the store).
    var state: JSONSpan?

    init(_ env: Envelope) throws(Refusal) {
        let fields = FieldReader(env: env, op: "register")
        body = env.body
        store = try fields.store()
        guard let handles = try fields.names("handles", ref: nil, what: "action types or prefix* patterns",
                                              Names.isValidPattern) else {
            throw .badMessage("register needs \"handles\": an array of action types or prefix* patterns")
        }
        self.handles = handles
        waitFor = try fields.names("waitFor", ref: nil, what: "store names", Names.isValidStore) ?? []
        queryDeltas = try fields.bool("queryDeltas") ?? false
        state = fields.state()
    }
}

/// `unregister` (SPEC §8.2).
struct UnregisterRequest {
    var store: String

    init(_ env: Envelope) throws(Refusal) {
        store = try FieldReader(env: env, op: "unregister").store()
    }
}

/// `dispatch` (SPEC §8.3), on the hot path: a trivial value of byte spans into the message (copying it costs no
/// reference counting), read through `Request`'s body. The type is decoded and checked only when it is not written
/// exactly as the last type routed (`knownTypeJSON`, which was valid).
struct DispatchRequest {
    var id: JSONSpan?
    var type: JSONSpan
    /// Whether `type` is written byte for byte as `knownTypeJSON`.
    var typeIsKnown: Bool
    var settle: Bool
    /// `ack` (since 0.4.0, SPEC §8.3): answer `accepted` with the seq once the action is accepted.
    var ack: Bool
    var cause: Int64?
    var payload: JSONSpan?
    /// `seq` (since 0.3.0, SPEC §8.3): the seq a replayed action must get (a fluxd started with `--replay`).
    var seq: Int64?

    @inline(__always)
    init(_ env: borrowing Envelope, knownTypeJSON: [UInt8]) throws(Refusal) {
        id = env.span(.id)
        var ref: String? = nil  // (only ids are decoded here: most dispatches have none)
        if let span = id {
            ref = span.kind == .string ? decodeJSONString(env.body[span.range]) : nil
            guard let ref, Names.isValidID(ref) else {
                throw .badMessage("\"id\" must be a string of 1 to \(Names.maxIDBytes) bytes")
            }
        }
        guard let typeSpan = env.span(.type) else {
            throw .badMessage("dispatch needs \"type\": an action type", ref: ref)
        }
        guard typeSpan.kind == .string else {
            throw .badMessage("\"type\" must be an action type: 1 to \(Names.maxTypeBytes) bytes of A-Z a-z 0-9 . _ : / -", ref: ref)
        }
        type = typeSpan
        typeIsKnown = !knownTypeJSON.isEmpty && sameBytes(knownTypeJSON, env.body[typeSpan.range])
        if !typeIsKnown {
            guard Names.isValidType(decodeJSONString(env.body[typeSpan.range])) else {
                throw .badMessage("\"type\" must be an action type: 1 to \(Names.maxTypeBytes) bytes of A-Z a-z 0-9 . _ : / -, no *", ref: ref)
            }
        }
        switch env.bool(.settle) {
        case .absent: settle = false
        case .value(let s): settle = s
        case .wrongType: throw .badMessage("\"settle\" must be a boolean", ref: ref)
        }
        if settle && id == nil { throw .badMessage("a dispatch with \"settle\": true needs an \"id\"") }
        // (Not one of the envelope's known fields: looked up among the others, and only when there are any: most
        // dispatches have none, and pay one load for it.)
        switch env.hasOtherFields ? env.bool("ack") : .absent {
        case .absent: ack = false
        case .value(let a): ack = a
        case .wrongType: throw .badMessage("\"ack\" must be a boolean", ref: ref)
        }
        if ack && id == nil { throw .badMessage("a dispatch with \"ack\": true needs an \"id\"") }
        switch env.int(.cause) {
        case .absent: cause = nil
        case .value(let c) where Names.isValidInteger(c, positive: true): cause = c
        default: throw .badMessage("\"cause\" must be the seq of an action: an integer from 1 to 2^53-1", ref: ref)
        }
        if env.span(.seq) == nil {  // (a table lookup, inlined: dispatches almost never carry one)
            seq = nil
        } else if case .value(let s) = env.int(.seq), Names.isValidInteger(s, positive: true) {
            seq = s
        } else {
            throw .badMessage("\"seq\" must be an integer from 1 to 2^53-1", ref: ref)
        }
        payload = env.span(.payload)
    }
}

/// `done` and `reject` (SPEC §8.3), on the hot path: byte spans into the message, as `DispatchRequest`. The store
/// name is decoded only when it is not written exactly as the store this peer answered for last.
struct AnswerRequest {
    var isDone: Bool
    var store: JSONSpan
    var seq: UInt64
    /// `done`: the new state, if any (the exact bytes the store wrote).
    var state: JSONSpan?
    /// `reject`: the store's error object, forwarded byte for byte.
    var error: JSONSpan?
    /// `done`, since fluxd 0.4.0 (SPEC §16.2): the change as a JSON Patch (an array; its operations are read only
    /// when it is applied), and the version it applies to.
    var patch: JSONSpan?
    var base: UInt64?

    @inline(__always)
    init(_ env: borrowing Envelope, isDone: Bool) throws(Refusal) {
        self.isDone = isDone
        let op: StaticString = isDone ? "done" : "reject"
        guard let storeSpan = env.span(.store), storeSpan.kind == .string else {
            throw .badMessage(env.span(.store) == nil ? "\(op) needs \"store\": a store name"
                              : "\"store\" must be a store name: 1 to \(Names.maxStoreBytes) bytes of A-Z a-z 0-9 . _ : / -")
        }
        store = storeSpan
        switch env.int(.seq) {  // (the store's name is decoded only for an error)
        case .value(let n) where Names.isValidInteger(n, positive: true): seq = UInt64(n)
        case .absent: throw .badMessage("\(op) needs \"seq\": the seq of the action it answers", ref: env.string(.store).value)
        default: throw .badMessage("\"seq\" must be an integer from 1 to 2^53-1", ref: env.string(.store).value)
        }
        if isDone {
            state = env.span(.state)
            if env.hasOtherFields, let span = env.span("patch") {
                let (patch, base) = try PatchRequest.patchAndBase(env, span, ref: env.string(.store).value)
                self.patch = patch
                self.base = base
            }
        } else {
            guard let span = env.span(.error), span.kind == .object,
                  let object = try? Envelope(body: Array(env.body[span.range])),
                  let code = object.string("code").value, !code.isEmpty, code.utf8.count <= 256,
                  object.span("message").map({ $0.kind == .string }) ?? true else {
                throw .badMessage("reject needs \"error\": {\"code\": a string of 1 to 256 bytes, \"message\": string}",
                                  ref: env.string(.store).value)
            }
            error = span
        }
    }

    /// The store name in `body`, decoded and checked (when it is not the peer's last store).
    func storeName(in body: [UInt8]) throws(Refusal) -> String {
        let name = decodeJSONString(body[store.range])
        guard Names.isValidStore(name) else {
            throw .badMessage("\"store\" must be a store name: 1 to \(Names.maxStoreBytes) bytes of A-Z a-z 0-9 . _ : / -", ref: name)
        }
        return name
    }
}

/// `state` (SPEC §8.4).
struct StateRequest {
    var body: [UInt8]
    var store: String
    var state: JSONSpan

    init(_ env: Envelope) throws(Refusal) {
        let fields = FieldReader(env: env, op: "state")
        body = env.body
        store = try fields.store()
        guard let state = fields.state() else {
            throw .badMessage("state needs \"state\": the store's new state (any JSON value)", ref: store)
        }
        self.state = state
    }
}

/// `patch` (SPEC §16.2): a store's change outside an action, as a JSON Patch.
struct PatchRequest {
    var body: [UInt8]
    var store: String
    var patch: JSONSpan
    var base: UInt64?

    init(_ env: Envelope) throws(Refusal) {
        store = try FieldReader(env: env, op: "patch").store()
        body = env.body
        guard let span = env.span("patch") else {
            throw .badMessage("patch needs \"patch\": the change, an array of JSON Patch operations", ref: store)
        }
        (patch, base) = try Self.patchAndBase(env, span, ref: store)
    }

    /// `patch` (it must be an array; its operations are read when it is applied) and the optional `base`.
    static func patchAndBase(_ env: Envelope, _ span: JSONSpan, ref: String?) throws(Refusal) -> (JSONSpan, UInt64?) {
        guard span.kind == .array else {
            throw .badMessage("\"patch\" must be an array of JSON Patch operations (RFC 6902)", ref: ref)
        }
        switch env.int("base") {
        case .absent: return (span, nil)
        case .value(let n) where Names.isValidInteger(n, positive: true): return (span, UInt64(n))
        default: throw .badMessage("\"base\" must be a version: an integer from 1 to 2^53-1", ref: ref)
        }
    }
}

/// `subscribe`, `unsubscribe` (SPEC §8.5, §16.3, §16.4).
struct StoreRequest {
    var store: String
    /// `deltas: true` (subscribe only).
    var deltas = false
    /// The version the subscriber holds (subscribe only).
    var from: UInt64?
    /// A path subscription's pointer: as given, and its tokens.
    var path: String?
    var tokens: [String] = []

    /// The longest `path`, in bytes (SPEC §16.4).
    static let maxPathBytes = 1024

    init(_ env: Envelope, op: StaticString) throws(Refusal) {
        let fields = FieldReader(env: env, op: op)
        store = try fields.store()
        switch env.string("path") {
        case .absent: break
        case .value(let text) where text.utf8.count <= Self.maxPathBytes:
            guard let tokens = Self.pointerTokens(text) else {
                throw .badMessage("\"path\" must be a JSON Pointer (RFC 6901): empty, or \"/\" before each token, \"~\" only as ~0 or ~1", ref: store)
            }
            path = text
            self.tokens = tokens
        default:
            throw .badMessage("\"path\" must be a JSON Pointer of at most \(Self.maxPathBytes) bytes", ref: store)
        }
        guard op.description == "subscribe" else { return }
        deltas = try fields.bool("deltas", ref: store) ?? false
        if deltas && path != nil {
            throw .badMessage("a path subscription cannot ask for deltas in protocol 1 (SPEC §16.3)", ref: store)
        }
        switch env.int("from") {
        case .absent: break
        case .value(let n) where Names.isValidInteger(n): from = UInt64(n)
        default: throw .badMessage("\"from\" must be a version: an integer from 0 to 2^53-1", ref: store)
        }
    }

    /// The unescaped tokens of an RFC 6901 pointer, or nil when it is not one.
    static func pointerTokens(_ text: String) -> [String]? {
        if text.isEmpty { return [] }
        guard text.hasPrefix("/") else { return nil }
        var tokens: [String] = []
        for raw in text.utf8.dropFirst().split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false) {
            var token: [UInt8] = []
            var i = raw.startIndex
            while i < raw.endIndex {
                let c = raw[i]
                if c == UInt8(ascii: "~") {
                    let next = raw.index(after: i)
                    guard next < raw.endIndex else { return nil }
                    switch raw[next] {
                    case UInt8(ascii: "0"): token.append(UInt8(ascii: "~"))
                    case UInt8(ascii: "1"): token.append(UInt8(ascii: "/"))
                    default: return nil
                    }
                    i = raw.index(after: next)
                } else {
                    token.append(c)
                    i = raw.index(after: i)
                }
            }
            tokens.append(String(decoding: token, as: UTF8.self))
        }
        return tokens
    }
}

/// `query` (SPEC §8.6).
struct QueryRequest {
    var id: String
    var idRaw: ArraySlice<UInt8>
    var store: String
    var query: ArraySlice<UInt8>

    init(_ env: Envelope) throws(Refusal) {
        let fields = FieldReader(env: env, op: "query")
        let id = try fields.id(required: true)!
        self.id = id.text
        idRaw = id.raw
        store = try fields.store(ref: id.text)
        guard let query = env.raw("query") else {
            throw .badMessage("query needs \"query\": the query's value (any JSON value)", ref: id.text)
        }
        self.query = query
    }
}

/// `unquery` (SPEC §8.6).
struct UnqueryRequest {
    var id: String
    var idRaw: ArraySlice<UInt8>

    init(_ env: Envelope) throws(Refusal) {
        let id = try FieldReader(env: env, op: "unquery").id(required: true)!
        self.id = id.text
        idRaw = id.raw
    }
}

/// `get` (SPEC §8.7).
struct GetRequest {
    var idRaw: ArraySlice<UInt8>?
    var id: String?
    var store: String

    init(_ env: Envelope) throws(Refusal) {
        let fields = FieldReader(env: env, op: "get")
        let id = try fields.id(required: false)
        self.id = id?.text
        idRaw = id?.raw
        store = try fields.store(ref: id?.text)
    }
}

/// `info`, `ping`, `pong` (SPEC §8.7): an optional id, echoed.
/// `forget` (SPEC §10): a privileged request to forget a store that is down.
struct ForgetRequest {
    var id: String
    var idRaw: ArraySlice<UInt8>
    var store: String

    init(_ env: Envelope) throws(Refusal) {
        let fields = FieldReader(env: env, op: "forget")
        let id = try fields.id(required: true)!
        self.id = id.text
        idRaw = id.raw
        store = try fields.store(ref: id.text)
    }
}

struct IdentifiedRequest {
    var idRaw: ArraySlice<UInt8>?

    init(_ env: Envelope, op: StaticString) throws(Refusal) {
        idRaw = try FieldReader(env: env, op: op).id(required: false)?.raw
    }
}

extension HostRequest {
    /// `workers`, `restart-worker`, `stop-worker` (SPEC §8.11); `history`, `state-at` (§8.12).
    init(_ env: Envelope, op: Op) throws(Refusal) {
        let fields = FieldReader(env: env, op: "host operation")
        if op == .history || op == .stateAt {
            let idRaw = try fields.id(required: false).map { Array($0.raw) }
            let ref = idRaw.map { decodeJSONString($0[...]) }
            func integer(_ key: String, _ range: ClosedRange<Int64>) throws(Refusal) -> Int64? {
                switch env.int(key) {
                case .absent: return nil
                case .value(let n) where range.contains(n): return n
                default: throw .badMessage("\"\(key)\" must be an integer from \(range.lowerBound) to \(range.upperBound)", ref: ref)
                }
            }
            if op == .history {
                let from = try integer("from", 1...Int64(Names.maxInteger))
                let limit = try integer("limit", 1...1000) ?? 100
                self = .history(idRaw: idRaw, from: from.map { UInt64($0) }, limit: Int(limit))
                return
            }
            let store = try fields.store(ref: ref)
            let version = try integer("version", 1...Int64(Names.maxInteger))
            let seq = try integer("seq", 0...Int64(Names.maxInteger))
            guard (version == nil) != (seq == nil) else {
                throw .badMessage("state-at needs exactly one of \"version\" and \"seq\"", ref: ref)
            }
            self = .stateAt(idRaw: idRaw, store: store, version: version.map { UInt64($0) }, seq: seq.map { UInt64($0) })
            return
        }
        guard let id = try fields.id(required: true)?.text else { throw .badMessage("\(op.rawValue) needs an \"id\"") }
        if op == .workers || op == .reload {
            self = op == .workers ? .workers(id: id) : .reload(id: id)
            return
        }
        guard case .value(let name) = env.string("name"), Names.isValidWorker(name) else {
            throw .badMessage("\(op.rawValue) needs \"name\": a worker name of 1 to 64 bytes of A-Z a-z 0-9 . _ -", ref: id)
        }
        self = op == .restartWorker ? .restartWorker(id: id, name: name) : .stopWorker(id: id, name: name)
    }
}
