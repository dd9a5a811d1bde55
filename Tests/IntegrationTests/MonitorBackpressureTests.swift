import FluxCore
import Foundation
import Testing

/// SPEC §8.10: a monitor must never slow routing down. A monitor that stops reading while the bus is busy costs
/// the dispatcher nothing: every action still settles; the monitor later learns how many events it missed.
@Suite("monitor backpressure", .onDedicatedThreads)
struct MonitorBackpressureTests {
    @Test("a monitor that stops reading never slows routing, and is told how many events it missed")
    func slowMonitorMissesEventsButRoutingGoesOn() throws {
        try withBusBlocking { bus in
            let path = bus.socketPath
            // A monitor that says hello and then reads nothing while the traffic below happens.
            let monitor = try RawPeer.ready(path, role: "monitor", name: "slow-monitor")
            let store = try RawPeer.ready(path, role: "store", name: "blob-store")
            try store.register("blobs", handles: ["blob/*"])
            let client = try RawPeer.ready(path, role: "client", name: "blob-writer")

            // 64 actions with 64 KiB payloads: about 4 MiB of `dispatch` events for the monitor, far beyond its
            // 1 MiB backlog allowance plus the kernel's socket buffer.
            let payload = "\"" + String(repeating: "x", count: 64 * 1024) + "\""
            let count = 64
            for i in 1...count {
                try client.send(frame: #"{"op":"dispatch","id":"d\#(i)","type":"blob/put","payload":\#(payload),"settle":true}"#)
                let action = try store.expect("action")
                #expect(action.int("seq") == i)
                try store.send(frame: #"{"op":"done","store":"blobs","seq":\#(i)}"#)
                let settled = try client.expect("settled")
                #expect(settled.string("id") == "d\(i)")
            }
            // Routing never waited for the monitor: every action settled while it read nothing.

            // Now the monitor reads. A ping is answered through the ordinary (never dropped) path, so once its
            // pong arrives the monitor's backlog is gone: what it got before is what was not dropped.
            let drained = try monitor.barrier("drain")
            let delivered = drained.filter { $0.op == "event" && $0.string("kind") == "dispatch" }.compactMap { $0.int("seq") }
            #expect(delivered.count < count, "some dispatch events were dropped (\(delivered.count) of \(count) delivered)")
            #expect(delivered == delivered.sorted(), "delivered events keep their order")
            #expect(!drained.contains { $0.op == "missed" }, "missed is sent before the next delivered event, not on its own")

            // The next event delivered is preceded by the count of those dropped.
            try client.send(frame: #"{"op":"dispatch","id":"last","type":"blob/put","payload":1}"#)
            let notice = try monitor.expect("missed")
            let missed = notice.int("count") ?? 0
            #expect(missed >= count - delivered.count, "missed counts at least the dropped dispatch events")
            let next = try monitor.expect("event")
            #expect(next.string("kind") == "dispatch")
            #expect(next.int("seq") == count + 1)
        }
    }
}
