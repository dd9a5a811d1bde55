import FluxClient
import FluxCore
import Foundation
import Glibc
import Testing

private struct Create: Encodable { var title: String }
private struct Todos: Decodable { struct Todo: Decodable { var title: String }; var todos: [Todo] }

/// Issue 17, item 7: under socket activation (systemd holds the listening socket, docs/systemd.md) restarting or
/// upgrading fluxd is a pause for its clients, not an outage: with the journal and the reconnecting libraries no
/// action is lost, none is applied twice, and nobody is refused a connection.
@Suite("Restart without downtime under socket activation")
struct ZeroDowntimeRestartTests {
    @Test("fluxd restarts through the activation socket under a client dispatching without pause and a live store: every action applied once, the client sees a pause")
    func restartUnderLiveTraffic() async throws {
        let dir = try TempDirectory(prefix: "fluxzd")
        defer { dir.remove() }
        let path = dir.path + "/fluxd.sock"
        let data = dir.path + "/data"
        // systemd's part: it binds and listens once and passes the socket to every fluxd it starts.
        let listener = try listeningSocket(at: path)
        defer { Glibc.close(listener) }
        let first = try ActivatedFluxd(descriptor: listener, arguments: ["--data-dir", data], directory: dir.path)
        defer { first.cleanup() }
        #expect(try await offPool { try first.waitForReady() } == "fluxd ready on \(path)")

        let store = try StoreProcess("todo-store", socketPath: path, logDirectory: dir.path)
        defer { store.cleanup() }
        try await store.waitForLine(containing: "todo-store ready")
        let client = try await withDeadline(.seconds(20), "connect") {
            try await FluxClient.connect(socketPath: path, name: "busy-view", requestTimeout: .seconds(30))
        }
        defer { client.abort() }
        let events = EventLog(client.connectivityEvents())

        // The client dispatches one action after another for as long as the test runs, each awaited to its
        // settlement; `notSent` (the action never reached fluxd) is the one answer it may retry.
        let target = 120
        let progress = Watched<Int>(0)
        let traffic = Task { () throws -> (longest: Duration, retried: Int) in
            var longest = Duration.zero
            var retried = 0
            for n in 1...target {
                let started = ContinuousClock.now
                while true {
                    do {
                        let settlement = try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "t\(n)"))
                        #expect(settlement.allDone, "todo/create t\(n): \(settlement)")
                        break
                    } catch FluxError.notSent {
                        retried += 1
                    }
                }
                longest = max(longest, ContinuousClock.now - started)
                progress.update { $0 = n }
            }
            return (longest, retried)
        }

        // Restart in the middle of the traffic: SIGTERM (the durable fluxd says bye and keeps unsettled work), and a
        // new fluxd on the same socket, as `systemctl restart fluxd` does with fluxd.socket active.
        let going = await progress.wait(timeout: .seconds(30)) { $0 >= 40 }
        try #require(going, "40 actions settled before the restart")
        #expect(try await offPool { first.stop() } == 0, "first fluxd stopped cleanly:\n\(first.stderr)")
        let second = try ActivatedFluxd(descriptor: listener, arguments: ["--data-dir", data], directory: dir.path)
        defer { second.cleanup() }
        #expect(try await offPool { try second.waitForReady() } == "fluxd ready on \(path)")

        let (longest, retried) = try await withDeadline(.seconds(60), "the client's \(target) actions") { try await traffic.value }
        let reconnected = try await events.wait("the client reconnected") { $0.contains(.reconnected(epochChanged: false)) }
        #expect(!reconnected.contains { if case .gaveUp = $0 { return true } else { return false } })
        // Every action once, in order: the journal kept fluxd's state and the store resumed from it.
        let state = try await client.get(store: "todos", as: Todos.self)
        #expect(state.state.todos.map(\.title) == (1...target).map { "t\($0)" })
        #expect(store.process.isRunning, "todo-store reconnected instead of exiting:\n\(store.stderr)")
        // The pause, for the record (not a timed assertion): how long the slowest action waited across the restart.
        print("zero-downtime restart: \(target) actions, the slowest waited \(longest) across the restart; \(retried) retried after notSent; connectivity: \(reconnected)")
        await client.close()
        #expect(try await offPool { second.stop() } == 0, "second fluxd stopped cleanly:\n\(second.stderr)")
    }
}
