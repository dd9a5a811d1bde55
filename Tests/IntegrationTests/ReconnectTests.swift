import FluxClient
import FluxCore
import Foundation
import Glibc
import Testing

/// A durable fluxd that a test stops and starts again on the same socket and data directory, with the example
/// processes started against it. Everything (processes, socket, journal) lives in one temp directory, removed by
/// `shutDown()`.
final class RestartableBus: @unchecked Sendable {
    // @unchecked: driven by one test; `lock` guards the mutable parts.
    let directory: TempDirectory
    let socketPath: String
    let dataDirectory: String
    private let lock = NSLock()
    private var current: Fluxd
    private var processes: [StoreProcess] = []
    private var clients: [FluxClient] = []

    init() async throws {
        directory = try TempDirectory(prefix: "fluxrc")
        socketPath = directory.path + "/fluxd.sock"
        dataDirectory = directory.path + "/data"
        do {
            current = try Fluxd(socketPath: socketPath, dataDirectory: dataDirectory)
            try await current.waitForReady()
        } catch {
            directory.remove()
            throw error
        }
    }

    var fluxd: Fluxd { lock.withLock { current } }

    /// Starts an example executable against this bus and waits for its ready line.
    func start(_ executable: String, readyLine: String) async throws -> StoreProcess {
        let child = try StoreProcess(executable, socketPath: socketPath, logDirectory: directory.path)
        lock.withLock { processes.append(child) }
        try await child.waitForLine(containing: readyLine)
        return child
    }

    /// A client (closed by `shutDown()`), reconnecting by default.
    func connect(_ name: String) async throws -> FluxClient {
        let path = socketPath
        let client = try await withDeadline(.seconds(20), "connect \(name)") {
            try await FluxClient.connect(socketPath: path, name: name, requestTimeout: .seconds(30))
        }
        lock.withLock { clients.append(client) }
        return client
    }

    /// Stops fluxd with SIGTERM (a durable fluxd says `bye` `restart` and keeps unsettled work), then starts it
    /// again on the same socket and data directory.
    func restart() async throws {
        let old = fluxd
        let status = await old.stop(timeout: .seconds(20))
        #expect(status == 0, "fluxd stopped cleanly:\n\(old.stderr)")
        await old.shutDown()
        let next = try Fluxd(socketPath: socketPath, dataDirectory: dataDirectory)
        lock.withLock { current = next }
        try await next.waitForReady()
    }

    /// What fluxd and the example processes logged (for failure messages).
    var logs: String {
        let (children, daemon) = lock.withLock { (processes, current) }
        return (["fluxd:\n" + daemon.stderr] + children.map { "\($0.executable) (pid \($0.pid)):\n" + $0.stderr })
            .joined(separator: "\n")
    }

    func shutDown() async {
        let (children, handles, daemon) = lock.withLock { (processes, clients, current) }
        for client in handles { client.abort() }
        for child in children { await child.shutDown() }
        await daemon.shutDown()
        directory.remove()
    }
}

/// Runs `body` with a restartable bus and always tears it down.
func withRestartableBus<T>(_ body: (RestartableBus) async throws -> T) async throws -> T {
    let bus = try await RestartableBus()
    do {
        let result = try await body(bus)
        await bus.shutDown()
        return result
    } catch {
        Issue.record("bus logs after failure:\n\(bus.logs)")
        await bus.shutDown()
        throw error
    }
}

private struct Create: Encodable { var title: String }

@Suite("Reconnecting clients and stores across a restart of a durable fluxd")
struct ReconnectIntegrationTests {
    @Test("fluxd restarts under a live todo-store and a subscribed client: both resume, versions go on with no repeat")
    func restartUnderALiveStoreAndClient() async throws {
        try await withRestartableBus { bus in
            let store = try await bus.start("todo-store", readyLine: "todo-store ready")
            let client = try await bus.connect("view")
            let events = EventLog(client.connectivityEvents())
            let sub = EventLog(client.subscribeJSON(store: "todos"))
            try await sub.wait("version 1") { $0.contains { $0.snapshot?.version == 1 } }
            let before = try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "milk")).requireDone()
            try await sub.wait("version 2") { $0.contains { $0.snapshot?.version == 2 } }

            try await bus.restart()
            try await events.wait("the client reconnected") { $0.contains(.reconnected(epochChanged: false)) }
            #expect(client.welcome.durability != "ephemeral" && client.welcome.epoch != nil)
            // The store reconnects by itself and registers again: subscribers hear it is up.
            try await sub.wait("todo-store registered again") { events in
                // After the client's second `subscribed`: up already, or a `store-up` later.
                let subscribed = events.indices.filter { if case .subscribed = events[$0] { return true } else { return false } }
                guard subscribed.count >= 2 else { return false }
                let again = subscribed[1]
                if case .subscribed(.up) = events[again] { return true }
                return events[again...].contains { if case .storeUp = $0 { return true } else { return false } }
            }

            let after = try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "eggs")).requireDone()
            #expect(after.seq > before.seq, "seq goes on after the restart")
            let seen = try await sub.wait("version 3") { $0.contains { $0.snapshot?.version == 3 } }
            #expect(seen.compactMap { $0.snapshot?.version } == [1, 2, 3], "each version once, in order")
            let state = String(decoding: try #require(seen.last?.snapshot).state.bytes, as: UTF8.self)
            #expect(state.contains("milk") && state.contains("eggs"), "the store resumed from its retained state: \(state)")
            #expect(store.process.isRunning, "todo-store waited for fluxd instead of exiting")
            #expect(store.stderr.contains("fluxd went away"), "\(store.stderr)")
            let all = events.items
            #expect(all.first.map { if case .disconnected = $0 { return true } else { return false } } == true)
            await client.close()
        }
    }

    @Test("a settlement pending across a restart is recovered and completes when its store answers")
    func pendingSettlementIsRecovered() async throws {
        try await withRestartableBus { bus in
            let store = try await bus.start("todo-store", readyLine: "todo-store ready")
            store.send(signal: SIGTERM)  // unregisters: the store is down, actions for it wait in its queue
            #expect(await store.waitForExit(timeout: .seconds(20)) == 0)

            let client = try await bus.connect("view")
            let events = EventLog(client.connectivityEvents())
            let pending = try client.beginDispatchAndSettle(type: "todo/create", payloadJSON: Array(#"{"title":"bread"}"#.utf8))
            _ = try await client.ping()  // fluxd has taken the dispatch (a ping is answered after it)

            try await bus.restart()
            try await events.wait("the client reconnected") { $0.contains(.reconnected(epochChanged: false)) }
            _ = try await bus.start("todo-store", readyLine: "todo-store ready")
            let settlement = try await pending.settlement(timeout: .seconds(30))
            #expect(settlement.results.map(\.store) == ["todos"])
            #expect(try settlement.requireDone().seq >= 1)
            let got = try await client.getJSON(store: "todos")
            #expect(String(decoding: got.state.bytes, as: UTF8.self).contains("bread"))
            await client.close()
        }
    }
}
