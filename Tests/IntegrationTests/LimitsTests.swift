import FluxCore
import Foundation
import Testing

/// §10 and §12 limits, nothing silently lost (R6): a full queue refuses with a reason instead of dropping anything.
@Suite("§10 queue limits", .onDedicatedThreads)
struct LimitsTests {
    static let arguments = ["--queue-limit", "2", "--store-window", "1", "--queue-timeout", "10000", "--fair-pending", "0"]

    @Test("queue limit: a live store's full queue refuses a dispatch as overloaded, which uses no seq")
    func fullQueueOfALiveStore() throws {
        try withBusBlocking(Self.arguments) { bus in
            let path = bus.socketPath
            let store = try RawPeer.ready(path, role: "store", name: "slow")
            try store.register("slow", handles: ["slow/*"])
            let client = try RawPeer.ready(path, name: "client")
            for i in 1...3 { try client.send(frame: #"{"op":"dispatch","id":"s\#(i)","type":"slow/x","settle":true}"#) }
            #expect(try store.expect("action").int("seq") == 1)
            #expect(try store.barrier().isEmpty, "window 1: one action in flight")
            #expect(try client.barrier().isEmpty)

            try client.send(frame: #"{"op":"dispatch","id":"s4","type":"slow/x","settle":true}"#)
            let refused = try client.expect("error")
            #expect(refused.string("code") == "overloaded")
            #expect(refused.string("ref") == "s4")
            #expect(refused.bool("fatal") == false)

            for seq in 1...3 {
                if seq > 1 { #expect(try store.expect("action").int("seq") == seq) }
                try store.send(frame: #"{"op":"done","store":"slow","seq":\#(seq)}"#)
                let settled = try client.expect("settled")
                #expect(settled.string("id") == "s\(seq)")
                #expect(settled.int("seq") == seq, "the refused dispatch used no seq")
            }
        }
    }

    @Test("queue limit: a down store's full queue settles a dispatch unavailable at once (it was accepted: it has a seq)")
    func fullQueueOfADownStore() throws {
        try withBusBlocking(Self.arguments) { bus in
            let path = bus.socketPath
            var store: RawPeer? = try RawPeer.ready(path, role: "store", name: "slow")
            try store!.register("slow", handles: ["slow/*"])
            let client = try RawPeer.ready(path, name: "client")

            // The store goes down: two actions wait in its queue, the third is settled unavailable at once.
            try client.subscribe("slow")
            store = nil
            #expect(try client.expect("store-down").string("reason") == "disconnected")
            for i in 1...3 { try client.send(frame: #"{"op":"dispatch","id":"d\#(i)","type":"slow/x","settle":true}"#) }
            let early = try client.barrier()
            #expect(early.map { $0.string("id") } == ["d3"], "only the action beyond the queue limit settles now: \(early)")
            let result = early.first?.results["slow"]
            #expect(result?["status"] as? String == "unavailable")
            #expect((result?["error"] as? [String: Any])?["code"] as? String == "store-unavailable")
            #expect(early.first?.int("seq") == 3, "it was still accepted (it has the seq after the two queued)")
        }
    }
}
