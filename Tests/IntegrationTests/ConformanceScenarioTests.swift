import Foundation
import Glibc
import Testing

/// Plays the language-neutral conformance scenarios (`protocol/conformance/*.json`, format in its README) against a
/// real fluxd through `RawPeer`: the same scripts the Python runner and the Node tests play.
@Suite("conformance scenarios", .onDedicatedThreads)
struct ConformanceScenarioTests {
    static let directory: String = {
        let here = URL(fileURLWithPath: #filePath)
        return here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("protocol/conformance").path
    }()

    static let files: [String] = {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.filter { $0.hasSuffix(".json") }.sorted()
    }()

    @Test("the scenario directory holds scenarios")
    func scenariosExist() {
        #expect(Self.files.count >= 10)
    }

    @Test("scenario", arguments: files)
    func play(_ file: String) throws {
        let data = try Data(contentsOf: URL(fileURLWithPath: Self.directory + "/" + file))
        let scenario = try JSONDecoder().decode(Scenario.self, from: data)
        try ScenarioPlayer(scenario: scenario, file: file).run()
    }

    @Test("the matcher binds a placeholder on first use and holds the value to it after")
    func matcherBindsPlaceholders() throws {
        var bindings: [String: ScenarioJSON] = [:]
        let pattern = try ScenarioJSON.parse(#"{"seq":"$s","x":"$absent"}"#)
        #expect(ScenarioPlayer.match(pattern, try .parse(#"{"seq":4,"y":1}"#), &bindings, "") == nil)
        #expect(bindings["$s"] == .int(4))
        #expect(ScenarioPlayer.match(pattern, try .parse(#"{"seq":5}"#), &bindings, "") != nil)
    }

    @Test("the matcher keeps booleans apart from numbers")
    func matcherKeepsBooleansApart() throws {
        var bindings: [String: ScenarioJSON] = [:]
        #expect(ScenarioPlayer.match(try .parse(#"{"v":true}"#), try .parse(#"{"v":1}"#), &bindings, "") != nil)
    }
}

/// A JSON value as the scenarios use it (integers kept apart from other numbers and from booleans).
enum ScenarioJSON: Codable, Equatable, Sendable {
    case null, bool(Bool), int(Int), double(Double), string(String), array([ScenarioJSON]), object([String: ScenarioJSON])

    init(from decoder: Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int.self) { self = .int(i) }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([ScenarioJSON].self) { self = .array(a) }
        else { self = .object(try c.decode([String: ScenarioJSON].self)) }
    }

    func encode(to encoder: Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .int(let i): try c.encode(i)
        case .double(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    static func parse(_ text: String) throws -> ScenarioJSON {
        try JSONDecoder().decode(ScenarioJSON.self, from: Data(text.utf8))
    }

    var text: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data(), as: UTF8.self)
    }

    subscript(key: String) -> ScenarioJSON? {
        if case .object(let o) = self { return o[key] }
        return nil
    }
}

/// One scenario file.
struct Scenario: Decodable {
    let name: String
    let description: String
    let fluxd: [String]?
    let steps: [ScenarioJSON]
}

/// Plays one scenario against a fresh fluxd.
struct ScenarioPlayer {
    let scenario: Scenario
    let file: String

    /// The ops fluxd sends in protocol 1 (SPEC §7); a peer ignores others (SPEC §13).
    static let knownOps: Set<String> = ["welcome", "registered", "action", "settled", "snapshot", "subscribed",
        "unsubscribed", "store-down", "store-up", "query-ok", "unquery-ok", "queries", "info", "got", "pong", "bye", "error",
        "recovered", "history", "state-at", "delta", "subtree", "forgotten"]

    static func isPlaceholder(_ s: String) -> Bool {
        guard s.hasPrefix("$"), !s.hasPrefix("$$"), s.count > 1 else { return false }
        let rest = s.dropFirst()
        guard let first = rest.first, first.isLetter || first == "_" else { return false }
        return rest.allSatisfy { $0.isLetter || $0.isNumber || "_.:-".contains($0) }
    }

    static func substitute(_ value: ScenarioJSON, _ bindings: [String: ScenarioJSON]) throws -> ScenarioJSON {
        switch value {
        case .string(let s) where s.hasPrefix("$$"): return .string(String(s.dropFirst()))
        case .string(let s) where isPlaceholder(s):
            guard let bound = bindings[s] else { throw HarnessError.unexpectedOutput("placeholder \(s) used before it was bound") }
            return bound
        case .array(let a): return .array(try a.map { try substitute($0, bindings) })
        case .object(let o): return .object(try o.mapValues { try substitute($0, bindings) })
        default: return value
        }
    }

    /// nil when `actual` matches `pattern` (binding new placeholders), else what differs.
    static func match(_ pattern: ScenarioJSON, _ actual: ScenarioJSON, _ bindings: inout [String: ScenarioJSON],
                      _ path: String) -> String? {
        switch pattern {
        case .string(let s) where isPlaceholder(s):
            if s == "$any" { return nil }
            if let bound = bindings[s] { return bound == actual ? nil : "\(path): \(actual.text) != \(s)=\(bound.text)" }
            bindings[s] = actual
            return nil
        case .string(let s) where s.hasPrefix("$$"):
            return actual == .string(String(s.dropFirst())) ? nil : "\(path): expected \(s.dropFirst()), got \(actual.text)"
        case .object(let o):
            guard case .object(let a) = actual else { return "\(path): expected an object, got \(actual.text)" }
            for (key, sub) in o.sorted(by: { $0.key < $1.key }) {
                if sub == .string("$absent") {
                    if a[key] != nil { return "\(path).\(key): expected absent" }
                    continue
                }
                guard let value = a[key] else { return "\(path).\(key): missing" }
                if let problem = match(sub, value, &bindings, "\(path).\(key)") { return problem }
            }
            return nil
        case .array(let p):
            guard case .array(let a) = actual, a.count == p.count else { return "\(path): expected \(p.count) elements, got \(actual.text)" }
            for (i, (x, y)) in zip(p, a).enumerated() {
                if let problem = match(x, y, &bindings, "\(path)[\(i)]") { return problem }
            }
            return nil
        case .int(let i):
            if case .double(let d) = actual, Double(i) == d { return nil }
            return pattern == actual ? nil : "\(path): expected \(pattern.text), got \(actual.text)"
        default:
            return pattern == actual ? nil : "\(path): expected \(pattern.text), got \(actual.text)"
        }
    }

    func run() throws {
        let fluxd = try Fluxd(arguments: scenario.fluxd ?? [])
        defer { fluxd.cleanup() }
        try fluxd.waitForReady()
        var peers: [String: RawPeer] = [:]
        var bindings: [String: ScenarioJSON] = [:]
        var barrier = 0

        func known(_ peer: RawPeer, _ timeout: Duration) throws -> [UInt8]? {
            let deadline = ContinuousClock.now + timeout
            while true {
                switch try peer.next(timeout: deadline - ContinuousClock.now) {
                case .eof: return nil
                case .timeout: throw HarnessError.timedOut("a frame")
                case .frame(let body):
                    guard let value = try? JSONDecoder().decode(ScenarioJSON.self, from: Data(body)),
                          case .string(let op) = value["op"] ?? .null else { return body }
                    if Self.knownOps.contains(op) { return body }
                }
            }
        }
        func expect(_ peer: RawPeer, _ pattern: ScenarioJSON, _ timeout: Duration) throws {
            guard let body = try known(peer, timeout) else { throw HarnessError.unexpectedOutput("connection closed instead of a frame") }
            let actual = try JSONDecoder().decode(ScenarioJSON.self, from: Data(body))
            var trial = bindings
            if let problem = Self.match(pattern, actual, &trial, "") {
                throw HarnessError.unexpectedOutput("\(problem)\n  frame: \(String(decoding: body, as: UTF8.self))")
            }
            bindings = trial
        }
        func peer(_ name: String) throws -> RawPeer {
            guard let p = peers[name] else { throw HarnessError.unexpectedOutput("no peer \(name)") }
            return p
        }

        for (index, step) in scenario.steps.enumerated() {
            do {
                guard case .string(let kind) = step["do"] ?? .null else { throw HarnessError.unexpectedOutput("step without do") }
                var name = ""
                if case .string(let n) = step["peer"] ?? .null { name = n }
                var timeout = Duration.seconds(10)
                if case .int(let t) = step["timeout"] ?? .null { timeout = .seconds(t) }
                switch kind {
                case "connect":
                    peers[name] = try RawPeer(connectingTo: fluxd.socketPath)
                case "hello":
                    if peers[name] == nil { peers[name] = try RawPeer(connectingTo: fluxd.socketPath) }
                    var role = "client"
                    if case .string(let r) = step["role"] ?? .null { role = r }
                    var peerName = name
                    if case .string(let n) = step["name"] ?? .null { peerName = n }
                    let hello = ScenarioJSON.object(["op": .string("hello"), "protocol": .int(1), "role": .string(role), "name": .string(peerName)])
                    try peer(name).send(frame: hello.text)
                    try expect(peer(name), .object(["op": .string("welcome"), "protocol": .int(1), "peer": .string("$peer.\(name)")]), timeout)
                case "send":
                    if let frame = step["frame"] {
                        try peer(name).send(frame: try Self.substitute(frame, bindings).text)
                    } else if case .string(let body) = step["body"] ?? .null {
                        try peer(name).send(frame: body)
                    } else if case .string(let hex) = step["hex"] ?? .null {
                        try peer(name).send(hexBytes(hex))
                    }
                case "expect":
                    try expect(peer(name), step["frame"] ?? .null, timeout)
                case "expect-closed":
                    if let body = try known(peer(name), timeout) {
                        throw HarnessError.unexpectedOutput("expected the connection to close, got \(String(decoding: body, as: UTF8.self))")
                    }
                case "quiet":
                    barrier += 1
                    try peer(name).send(frame: #"{"op":"ping","id":"quiet-\#(barrier)"}"#)
                    try expect(peer(name), .object(["op": .string("pong"), "id": .string("quiet-\(barrier)")]), timeout)
                case "close":
                    // fluxd may see the next peer's frames before this connection's end (two sockets, one loop
                    // iteration): wait, with a deadline, until `info` counts one connection fewer, as a person
                    // starting the next process after the first one ended would.
                    let probe = try RawPeer.ready(fluxd.socketPath, name: "scenario-probe")
                    func open(_ k: Int) throws -> Int {
                        try probe.send(frame: #"{"op":"info","id":"probe-\#(k)"}"#)
                        return (try probe.expect("info").object["peers"] as? [String: Int])?.values.reduce(0, +) ?? 0
                    }
                    let before = try open(0)
                    peers[name] = nil
                    let deadline = ContinuousClock.now + .seconds(1)
                    var k = 1
                    while try open(k) >= before && ContinuousClock.now < deadline {
                        k += 1
                        usleep(1000)  // polling interval; the count decides
                    }
                case "signal":
                    guard case .string(let signal) = step["signal"] ?? .null, signal == "TERM" || signal == "INT" else {
                        throw HarnessError.unexpectedOutput("unsupported signal")
                    }
                    fluxd.send(signal: signal == "TERM" ? SIGTERM : SIGINT)
                default:
                    throw HarnessError.unexpectedOutput("unknown step kind \(kind)")
                }
            } catch {
                Issue.record("\(file) step \(index + 1) \(step.text.prefix(160)): \(error)\nfluxd stderr:\n\(fluxd.stderr.suffix(2000))")
                return
            }
        }
    }
}

private func hexBytes(_ hex: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        bytes.append(UInt8(hex[index..<next], radix: 16) ?? 0)
        index = next
    }
    return bytes
}
