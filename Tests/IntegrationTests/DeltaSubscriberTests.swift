import FluxCore
import FluxJSONValue
import Foundation
import Testing

/// SPEC §16 with the real fluxd and the Swift todo-store (which publishes its changes as patches): a delta
/// subscriber, a full subscriber and a path subscriber on one store hold, at every version, the state `get` returns;
/// the path subscriber is not woken by changes elsewhere.
@Suite("SPEC §16 with real processes")
struct DeltaSubscriberTests {
    /// A message's field as a JSON value (the state, a patch, a subtree's value), member order and numbers kept.
    static func json(_ m: Message, _ key: String) throws -> JSONValue? {
        try JSONValue(parsing: m.body)[key]
    }

    @Test("delta, full and path subscribers of todo-store agree with get at every version; the path one only wakes when touched", .onDedicatedThreads)
    func subscribersAgreeWithGet() throws {
        try withBusBlocking { bus in
            // Every change as a patch, however small the state (FluxStore sends states up to 1 KiB whole by default).
            try bus.startBlocking("todo-store", environment: ["FLUXBUS_WHOLE_STATE_LIMIT": "0"])
            // The dispatcher is the delta subscriber (R5 puts its delta before each settlement).
            let dispatcher = try RawPeer.ready(bus.socketPath, name: "delta")
            let full = try RawPeer.ready(bus.socketPath, name: "full")
            let path = try RawPeer.ready(bus.socketPath, name: "path")
            try dispatcher.send(frame: #"{"op":"subscribe","store":"todos","deltas":true}"#)
            #expect(try dispatcher.expect("subscribed").bool("deltas") == true)
            var held = try #require(try Self.json(try dispatcher.expect("snapshot"), "state"))
            var heldVersion = 1
            try full.send(frame: #"{"op":"subscribe","store":"todos"}"#)
            _ = try full.expect("subscribed")
            var fullState = try #require(try Self.json(try full.expect("snapshot"), "state"))
            try path.send(frame: #"{"op":"subscribe","store":"todos","path":"/todos/1"}"#)
            #expect(try path.expect("subscribed").string("path") == "/todos/1")
            var pathValue: JSONValue? = nil
            let first = try path.expect("subtree")
            #expect(first.bool("exists") == false)

            // Whether the change touches /todos/1 (nil: it depends on how the store wrote it; the first change of
            // an empty array may replace the whole array, an ancestor of the path).
            let steps: [(String, String, touchesPath: Bool?)] = [
                ("todo/create", #"{"title":"a"}"#, nil),
                ("todo/create", #"{"title":"b"}"#, true),     // appended at index 1: /todos/1 now exists
                ("todo/create", #"{"title":"c"}"#, false),
                ("todo/toggle", #"{"id":3}"#, false),         // index 2: elsewhere
                ("todo/toggle", #"{"id":2}"#, true),
                ("todo/edit", #"{"id":1,"title":"A"}"#, false),
                ("todo/delete", #"{"id":1}"#, true),          // index 0 removed: /todos/1 is now todo 3
            ]
            var deltas = 0
            for (n, step) in steps.enumerated() {
                try dispatcher.send(frame: #"{"op":"dispatch","id":"s\#(n)","type":"\#(step.0)","payload":\#(step.1),"settle":true}"#)
                let (before, settled) = try dispatcher.read(until: "settled s\(n)") { $0.op == "settled" }
                let version = try #require(settled.results["todos"]?["version"] as? Int)
                for m in before {
                    switch m.op {
                    case "delta":
                        #expect(m.int("from") == heldVersion, "a delta from \(m.int("from") ?? -1) while holding \(heldVersion)")
                        let patch = try JSONPatch(try #require(try Self.json(m, "patch")))
                        try held.apply(patch)
                        heldVersion = try #require(m.int("version"))
                        deltas += 1
                    case "snapshot":
                        held = try #require(try Self.json(m, "state"))
                        heldVersion = try #require(m.int("version"))
                    default:
                        break
                    }
                }
                try dispatcher.send(frame: #"{"op":"get","id":"g\#(n)","store":"todos"}"#)
                let got = try dispatcher.expect("got")
                let truth = try #require(try Self.json(got, "state"))
                #expect(got.int("version") == version && heldVersion == version, "step \(n)")
                #expect(held.jsonEquals(truth), "step \(n): the delta subscriber holds \(held.compact), get says \(truth.compact)")
                // The full subscriber, on its own connection: every version as a whole snapshot.
                while true {
                    let m = try full.expect("snapshot")
                    fullState = try #require(try Self.json(m, "state"))
                    if m.int("version") == version { break }
                }
                #expect(fullState.jsonEquals(truth), "step \(n): the full subscriber")
                // The path subscriber: whatever fluxd sent it for this version came before the answer to a ping sent
                // now (one connection's frames are in order).
                let woken = try path.barrier("p\(n)").filter { $0.op == "subtree" }
                #expect(step.touchesPath.map { !woken.isEmpty == $0 } ?? true, "step \(n) (\(step.0) \(step.1)): path subscriber woken \(woken.count) times")
                if let last = woken.last {
                    pathValue = last.bool("exists") == true ? try Self.json(last, "value") : nil
                }
                let expected = truth["todos"]?[1]
                #expect(pathValue == expected || (pathValue != nil && expected != nil && pathValue!.jsonEquals(expected!)),
                        "step \(n): the path subscriber holds \(pathValue?.compact ?? "nothing"), the state has \(expected?.compact ?? "nothing")")
            }
            #expect(deltas >= steps.count - 1, "todo-store publishes patches: \(deltas) deltas for \(steps.count) changes")
        }
    }
}
