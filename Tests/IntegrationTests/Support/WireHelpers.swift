import FluxCore
import Foundation
import Glibc

/// A decoded message from fluxd, with the exact bytes it came in.
struct Message: CustomStringConvertible {
    let body: [UInt8]
    let object: [String: Any]

    var op: String? { object["op"] as? String }
    subscript(key: String) -> Any? { object[key] }
    func string(_ key: String) -> String? { object[key] as? String }
    func int(_ key: String) -> Int? { object[key] as? Int }
    func bool(_ key: String) -> Bool? { object[key] as? Bool }
    func objects(_ key: String) -> [[String: Any]] { object[key] as? [[String: Any]] ?? [] }
    var text: String { String(decoding: body, as: UTF8.self) }
    var description: String { text }

    /// The `results` of a `settled`, by store name.
    var results: [String: [String: Any]] {
        var out: [String: [String: Any]] = [:]
        for r in objects("results") { if let s = r["store"] as? String { out[s] = r } }
        return out
    }

    /// The `state` object of a `snapshot` or `got`, decoded as `T`.
    func state<T: Decodable>(as type: T.Type) throws -> T {
        guard let state = object["state"] else { throw HarnessError.unexpectedOutput("no state in \(text)") }
        return try JSONDecoder().decode(T.self, from: JSONSerialization.data(withJSONObject: state, options: [.fragmentsAllowed]))
    }
}

extension RawPeer {
    /// The next message (throws on EOF, timeout, or a body that is not a JSON object).
    func message(timeout: Duration = .seconds(20)) throws -> Message {
        switch try next(timeout: timeout) {
        case .frame(let body):
            guard let object = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
                throw HarnessError.unexpectedOutput(String(decoding: body, as: UTF8.self))
            }
            return Message(body: body, object: object)
        case .eof: throw HarnessError.unexpectedOutput("EOF instead of a frame")
        case .timeout: throw HarnessError.timedOut("frame from fluxd")
        }
    }

    /// The next message, which must have this op.
    @discardableResult
    func expect(_ op: String, timeout: Duration = .seconds(20)) throws -> Message {
        let m = try message(timeout: timeout)
        guard m.op == op else { throw HarnessError.unexpectedOutput("expected \(op), got \(m.text)") }
        return m
    }

    /// Reads until a message satisfies `predicate`; returns the messages before it and the match.
    func read(until what: String, timeout: Duration = .seconds(20),
              _ predicate: (Message) -> Bool) throws -> (before: [Message], match: Message) {
        let deadline = ContinuousClock.now + timeout
        var before: [Message] = []
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { throw HarnessError.timedOut("\(what); got so far: \(before)") }
            let m: Message
            do {
                m = try message(timeout: remaining)
            } catch let error as HarnessError {
                throw HarnessError.unexpectedOutput("\(what): \(error); got so far: \(before)")
            }
            if predicate(m) { return (before, m) }
            before.append(m)
        }
    }

    /// Sends `ping` with `id` and returns every message that came before the `pong` (the ordering barrier of §8.7).
    func barrier(_ id: String = "barrier", timeout: Duration = .seconds(20)) throws -> [Message] {
        try send(frame: #"{"op":"ping","id":"\#(id)"}"#)
        return try read(until: "pong \(id)", timeout: timeout) { $0.op == "pong" && $0.string("id") == id }.before
    }

    /// Connects and says hello.
    static func ready(_ path: String, role: String = "client", name: String = "test") throws -> RawPeer {
        let peer = try RawPeer(connectingTo: path)
        try peer.send(frame: #"{"op":"hello","protocol":1,"role":"\#(role)","name":"\#(name)"}"#)
        try peer.expect("welcome")
        return peer
    }

    /// As a store-role peer: registers a store and reads `registered`, the snapshot (if any) and `queries`.
    @discardableResult
    func register(_ store: String, handles: [String], waitFor: [String] = [], state: String? = nil) throws -> [Message] {
        var json = #"{"op":"register","store":"\#(store)","handles":\#(jsonArray(handles)),"waitFor":\#(jsonArray(waitFor))"#
        if let state { json += #","state":\#(state)"# }
        try send(frame: json + "}")
        let registered = try expect("registered")
        let (before, queries) = try read(until: "queries of \(store)") { $0.op == "queries" && $0.string("store") == store }
        return [registered] + before + [queries]
    }

    /// Subscribes and reads `subscribed` (and the retained snapshot when the store has one).
    @discardableResult
    func subscribe(_ store: String) throws -> [Message] {
        try send(frame: #"{"op":"subscribe","store":"\#(store)"}"#)
        let subscribed = try expect("subscribed")
        if (subscribed.int("version") ?? 0) > 0 { return [subscribed, try expect("snapshot")] }
        return [subscribed]
    }
}

func jsonArray(_ strings: [String]) -> String {
    "[" + strings.map { "\"\($0)\"" }.joined(separator: ",") + "]"
}

/// A JSON string literal for `text` (escaped).
func jsonString(_ text: String) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: text, options: [.fragmentsAllowed]), as: UTF8.self)
}

// MARK: - The examples' states, as seen on the wire (decoded independently of the example's own model types)

struct TodoItem: Codable, Equatable, Sendable {
    var id: Int
    var title: String
    var done: Bool
    var createdSeq: Int
}

/// The `todos` store's state (todo-store).
struct TodoList: Codable, Equatable, Sendable {
    var todos: [TodoItem]
    var nextID: Int
}

/// The `stats` store's state (stats-store).
struct TodoStats: Codable, Equatable, Sendable {
    var total: Int
    var done: Int
    var open: Int
    var todosVersionSeen: Int
    var lastSeq: Int
}

struct Title: Codable, Sendable { var title: String }
struct TodoID: Codable, Sendable { var id: Int }
