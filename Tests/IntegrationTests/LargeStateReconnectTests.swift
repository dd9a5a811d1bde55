import FluxClient
import FluxCore
import Foundation
import Testing

/// Issue 24, attack 5: a store whose state is larger than `maxFrame` registers again after fluxd restarts
/// (SPEC §16.6): it adopts a durable fluxd's retained state, and publishes its state in pieces to an ephemeral one
/// that kept nothing. Against the real fluxd and the real todo-store, with a small `--max-frame` so a few hundred
/// todos are enough.
@Suite("A store with a state larger than a frame registers again after fluxd restarts")
struct LargeStateReconnectTests {
    private struct Create: Encodable { var title: String }
    private struct Todos: Decodable { var todos: [Todo] }
    private struct Todo: Decodable { var title: String }

    static let maxFrame = 16_384
    static let todos = 400  // ~40 KB of state: over twice the frame

    func run(durable: Bool) async throws {
        let dir = try TempDirectory(prefix: "fluxls")
        defer { dir.remove() }
        let socket = dir.path + "/fluxd.sock"
        let data = durable ? dir.path + "/data" : nil
        var fluxd = try Fluxd(arguments: ["--max-frame", String(Self.maxFrame)], socketPath: socket, dataDirectory: data)
        var store: StoreProcess?
        var client: FluxClient?
        do {
            try await fluxd.waitForReady()
            store = try StoreProcess("todo-store", socketPath: socket, logDirectory: dir.path)
            try await store!.waitForLine(containing: "todo-store ready")
            client = try await withDeadline(.seconds(20), "connect") {
                try await FluxClient.connect(socketPath: socket, name: "view", requestTimeout: .seconds(30))
            }
            for i in 0..<Self.todos {
                _ = try await client!.dispatchAndSettle(type: "todo/create", payload: Create(title: "todo number \(i), long enough to take room")).requireDone()
            }
            let before = try await client!.getJSON(store: "todos")
            #expect(before.state.bytes.count > 2 * Self.maxFrame)

            // fluxd restarts: durable keeps the state (the store adopts it), ephemeral keeps nothing (the store
            // publishes its state in pieces).
            #expect(await fluxd.stop(timeout: .seconds(20)) == 0, "\(fluxd.stderr)")
            await fluxd.shutDown()
            fluxd = try Fluxd(arguments: ["--max-frame", String(Self.maxFrame)], socketPath: socket, dataDirectory: data)
            try await fluxd.waitForReady()

            let deadline = ContinuousClock.now + .seconds(30)
            var after: Snapshot<Todos>?
            while ContinuousClock.now < deadline {
                if let snapshot = try? await client!.get(store: "todos", as: Todos.self, timeout: .seconds(5)),
                   snapshot.state.todos.count == Self.todos {
                    after = snapshot
                    break
                }
                try await Task.sleep(for: .milliseconds(50))  // (polling `get` with a deadline: no event to wait for)
            }
            let snapshot = try #require(after, "the store did not register again with its \(Self.todos) todos:\n\(store!.stderr)\n\(fluxd.stderr)")
            #expect(snapshot.state.todos.first?.title == "todo number 0, long enough to take room")
            // It answers actions again, and its state goes on from there.
            _ = try await client!.dispatchAndSettle(type: "todo/create", payload: Create(title: "after")).requireDone()
            let last = try await client!.get(store: "todos", as: Todos.self)
            #expect(last.state.todos.count == Self.todos + 1)
            #expect(last.state.todos.last?.title == "after")
            if !durable {
                #expect(store!.stderr.contains("published in"), "the pieces were logged:\n\(store!.stderr)")
            }
            #expect(!fluxd.stderr.contains("too-large"), "no register over maxFrame:\n\(fluxd.stderr)")
            #expect(store!.process.isRunning)
        } catch {
            Issue.record("logs:\n\(store?.stderr ?? "")\nfluxd:\n\(fluxd.stderr)")
            client?.abort()
            await store?.shutDown()
            await fluxd.shutDown()
            throw error
        }
        client?.abort()
        await store?.shutDown()
        await fluxd.shutDown()
    }

    @Test("an ephemeral fluxd restarted: the store publishes its state in pieces, each within maxFrame")
    func ephemeral() async throws { try await run(durable: false) }

    @Test("a durable fluxd restarted: the store adopts the retained state without sending it")
    func durable() async throws { try await run(durable: true) }
}
