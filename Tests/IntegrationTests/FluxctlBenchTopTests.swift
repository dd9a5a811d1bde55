import FluxClient
import Foundation
import Testing

/// `fluxctl bench` and `fluxctl top --once --json` as real processes against a real fluxd.
@Suite("fluxctl bench and top")
struct FluxctlBenchTopTests {
    @Test("bench --json --actions 200: both modes with the pinned keys, 200 actions each; its store is unregistered and forgotten at the end")
    func bench() async throws {
        try await withBus { bus in
            let run = try await bus.ctl("bench", "--json", "--actions", "200", "--warmup", "20", "--window", "16", "--payload", "32")
            #expect(run.status == 0, "\(run)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any], "\(run)")
            #expect(run.lines.count == 1)
            let order = try #require(run.stdout.range(of: #"^\{"server":"fluxd/[^"]+","durability":"ephemeral","store":"bench\.\d+\.\d+","actionType":"bench\.\d+\.\d+/act","payloadBytes":32,"warmup":20,"window":16,"results":\[\{"mode":"roundTrip","actions":200,"seconds":"#, options: .regularExpression), "\(run)")
            #expect(order.lowerBound == run.stdout.startIndex)
            let results = try #require(object["results"] as? [[String: Any]])
            #expect(results.map { $0["mode"] as? String } == ["roundTrip", "pipelined"])
            for r in results {
                #expect(Set(r.keys) == ["mode", "actions", "seconds", "actionsPerSecond", "p50Us", "p90Us", "p99Us", "p999Us", "maxUs"])
                #expect(r["actions"] as? Int == 200)
                let p50 = try #require(r["p50Us"] as? Double), p99 = try #require(r["p99Us"] as? Double), max = try #require(r["maxUs"] as? Double)
                #expect(p50 > 0 && p50 <= p99 && p99 <= max, "\(r)")
                #expect((r["actionsPerSecond"] as? Double ?? 0) > 0)
            }
            // The throwaway store is forgotten at the end: fluxd no longer knows it (issue 26).
            let store = try #require(object["store"] as? String)
            #expect(store.hasPrefix("bench."))
            #expect(!run.stderr.contains("stays known"), "\(run)")
            let client = try await bus.connect("check")
            let info = try await client.info()
            #expect(!info.stores.contains { $0.name == store }, "\(info)")
            await client.close()
        }
    }

    @Test("top --once --json: the entry of a store that settled actions during the sample (rate, latency, subscribers, version)")
    func topOnce() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            let client = try await bus.connect("top-test")
            let todos = client.subscribe(store: "todos", as: AnyCodable.self)
            // A monitor of the test's own sees top's two connections arrive (its monitor, then its info client).
            let watcher = try await bus.connect("watcher", role: .monitor)
            let connects = EventLog(watcher.monitorEvents().compactMap { e -> String? in
                e.kind == "connect" ? "\(e.message.string("role").value ?? "")/\(e.message.string("name").value ?? "")" : nil
            })
            // The sample covers the three round trips below whatever the machine's speed: it would last an hour, and
            // SIGINT ends it once they are settled (top --once prints the sample so far and exits 0).
            let top = try FluxctlProcess(["top", "--once", "--json", "--interval", "3600"], socket: bus.socketPath)
            defer { top.cleanup() }
            try await connects.wait("top's monitor and client connections") { $0.filter { $0.hasSuffix("/fluxctl") }.count == 2 }
            for title in ["milk", "eggs", "bread"] {
                try await client.dispatchAndSettle(type: "todo/create", payload: ["title": title]).requireDone()
            }
            kill(top.pid, SIGINT)
            let result = try await top.finish(timeout: .seconds(40))
            #expect(result.status == 0, "\(result)")
            #expect(result.lines.count == 1, "\(result)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result)")
            #expect(Array(object.keys).sorted() == ["actionsPerSecond", "bytesInPerSecond", "bytesOutPerSecond", "connections", "durability",
                                                    "framesInPerSecond", "framesOutPerSecond", "intervalSeconds", "missedEvents", "seq",
                                                    "server", "socket", "stores", "uptimeSeconds"])
            #expect(object["durability"] as? String == "ephemeral")
            #expect((object["uptimeSeconds"] as? Double ?? -1) >= 0, "\(result)")
            let connections = try #require(object["connections"] as? [String: Any])
            #expect(connections["monitor"] as? Int == 2 && connections["store"] as? Int == 1, "\(connections)")
            let stores = try #require(object["stores"] as? [[String: Any]])
            let entry = try #require(stores.first { $0["name"] as? String == "todos" }, "\(result)")
            #expect(entry["status"] as? String == "up")
            #expect(entry["actions"] as? Int == 3, "\(entry)")
            #expect((entry["actionsPerSecond"] as? Double ?? 0) > 0)
            #expect(entry["subscribers"] as? Int == 1)
            #expect(entry["queued"] as? Int == 0 && entry["inflight"] as? Int == 0)
            #expect((entry["version"] as? Int ?? 0) >= 4, "\(entry)")
            let latency = try #require(entry["latencyMs"] as? [String: Any], "\(entry)")
            #expect(latency["samples"] as? Int == 3)
            #expect((latency["p50"] as? Int ?? -1) >= 0 && (latency["max"] as? Int ?? -1) >= (latency["p50"] as? Int ?? 0))
            #expect((entry["owner"] as? String)?.hasPrefix("todo-store") == true, "\(entry)")
            _ = todos
            connects.cancel()
            await watcher.close()
            await client.close()
        }
    }
}
