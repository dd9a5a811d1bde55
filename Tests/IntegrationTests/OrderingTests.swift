import FluxClient
import FluxCore
import Foundation
import Glibc
import Testing

/// R1: one global order. However many clients dispatch at once, every store sees the actions it handles in
/// increasing `seq`, and each connection's actions keep the order it sent them in.
@Suite("R1 one global order")
struct OrderingTests {
    static let clients = 8
    static let perClient = 50

    @Test("8 FluxClients dispatching 50 creates each at once: todo-store applies all 400 in seq order, each client's in its own order")
    func concurrentClientsAgainstTodoStore() async throws {
        try await withBus { bus in
            _ = try await bus.start("todo-store")
            var connections: [FluxClient] = []
            for k in 0..<Self.clients { connections.append(try await bus.connect("client-\(k)")) }

            // Each client fires 49 creates and settles the 50th; all 8 run concurrently on their own sockets.
            let lastSettlements = try await withThrowingTaskGroup(of: (Int, Settlement).self) { group in
                for (k, client) in connections.enumerated() {
                    group.addTask {
                        for i in 0..<(Self.perClient - 1) {
                            try client.dispatch(type: "todo/create", payload: Title(title: "c\(k)-\(i)"))
                            if i % 4 == 0 { await Task.yield() }
                        }
                        let last = try await withDeadline(.seconds(30), "settlement of client \(k)") {
                            try await client.dispatchAndSettle(type: "todo/create", payload: Title(title: "c\(k)-\(Self.perClient - 1)"))
                        }
                        return (k, last)
                    }
                }
                var out: [Int: Settlement] = [:]
                for try await (k, s) in group { out[k] = s }
                return out
            }

            // Once a client's last create settled, its 49 earlier ones (lower seqs, same store) are answered too.
            let reader = connections[0]
            let snapshot = try await withDeadline(.seconds(20), "get todos") { try await reader.get(store: "todos", as: TodoList.self) }
            let todos = snapshot.state.todos
            let total = Self.clients * Self.perClient
            #expect(todos.count == total)
            var expectedTitles: Set<String> = []
            for k in 0..<Self.clients { for i in 0..<Self.perClient { expectedTitles.insert("c\(k)-\(i)") } }
            #expect(Set(todos.map(\.title)) == expectedTitles)
            // The store appends in the order it handles actions: createdSeq increasing = delivered in seq order.
            let seqs = todos.map(\.createdSeq)
            #expect(zip(seqs, seqs.dropFirst()).allSatisfy { $0 < $1 }, "createdSeq not strictly increasing: \(seqs)")
            #expect(seqs == Array(1...total), "only these 400 actions were dispatched, so they hold seqs 1...400")
            for k in 0..<Self.clients {
                let mine = todos.filter { $0.title.hasPrefix("c\(k)-") }.map(\.title)
                #expect(mine == (0..<Self.perClient).map { "c\(k)-\($0)" }, "client \(k)'s creates out of its dispatch order")
                let last = try #require(lastSettlements[k])
                #expect(last.results.map(\.store) == ["todos"])
                if case .done(let version) = last["todos"] {
                    #expect(version >= 2)
                } else {
                    Issue.record("client \(k)'s last create did not settle done: \(last)")
                }
                #expect(todos.first { $0.title == "c\(k)-\(Self.perClient - 1)" }?.createdSeq == last.seq)
            }
            #expect(snapshot.version == 1 + total, "version 1 is the initial state, then one version per create")
        }
    }

    @Test("wire level: 8 raw clients on their own threads, a raw store sees strictly increasing seqs 1...400 and each client's order", .onDedicatedThreads)
    func wireOrderAtTheStore() throws {
        try withBusBlocking { bus in
            let path = bus.socketPath
            let store = try RawPeer.ready(path, role: "store", name: "order-store")
            try store.register("ordered", handles: ["ord/*"])

            final class Box: @unchecked Sendable {
                let lock = NSLock()
                var settled: [Int: String] = [:]
                var failures: [String] = []
            }
            let box = Box()
            let connected = DispatchGroup()
            let finished = DispatchGroup()
            let go = DispatchSemaphore(value: 0)
            for k in 0..<Self.clients {
                connected.enter()
                finished.enter()
                let thread = Thread {
                    defer { finished.leave() }
                    var didConnect = false
                    do {
                        let peer = try RawPeer.ready(path, name: "client-\(k)")
                        didConnect = true
                        connected.leave()
                        go.wait()
                        for i in 0..<Self.perClient {
                            let settle = i == Self.perClient - 1 ? #","id":"last-\#(k)","settle":true"# : ""
                            try peer.send(frame: #"{"op":"dispatch","type":"ord/step","payload":{"c":\#(k),"i":\#(i)}\#(settle)}"#)
                        }
                        let settled = try peer.expect("settled", timeout: .seconds(30))
                        box.lock.withLock { box.settled[k] = settled.text }
                    } catch {
                        if !didConnect { connected.leave() }
                        box.lock.withLock { box.failures.append("client \(k): \(error)") }
                    }
                }
                thread.start()
            }
            #expect(connected.wait(timeout: .now() + 20) == .success)
            for _ in 0..<Self.clients { go.signal() }

            // The store answers each action as it comes (done, no state) and records what it saw.
            var seen: [(seq: Int, origin: Int, c: Int, i: Int)] = []
            let total = Self.clients * Self.perClient
            while seen.count < total {
                let action = try store.expect("action", timeout: .seconds(30))
                let payload = action["payload"] as? [String: Any]
                seen.append((action.int("seq") ?? -1, action.int("origin") ?? -1, payload?["c"] as? Int ?? -1, payload?["i"] as? Int ?? -1))
                try store.send(frame: #"{"op":"done","store":"ordered","seq":\#(action.int("seq") ?? 0)}"#)
            }
            #expect(finished.wait(timeout: .now() + 30) == .success)
            #expect(box.lock.withLock { box.failures } == [])

            let seqs = seen.map(\.seq)
            #expect(seqs == Array(1...total), "the store must see seqs 1...\(total) in increasing order")
            for k in 0..<Self.clients {
                let mine = seen.filter { $0.c == k }
                #expect(mine.map(\.i) == Array(0..<Self.perClient), "client \(k)'s actions reordered")
                #expect(Set(mine.map(\.origin)).count == 1, "one connection, one origin")
                let text = try #require(box.lock.withLock { box.settled[k] })
                let settled = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
                #expect(settled?["seq"] as? Int == mine.last?.seq)
                #expect((settled?["results"] as? [[String: Any]])?.first?["status"] as? String == "done")
            }
        }
    }
}
