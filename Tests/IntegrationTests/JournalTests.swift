import Foundation
import Glibc
import Testing

/// A durable fluxd's journal seen from fluxctl, with the real todo store (issue 15): the history with outcomes,
/// past states, and a replay of an export into fresh stores on an ephemeral bus that ends in the same state.
@Suite("fluxctl journal and replay", .onDedicatedThreads)
struct JournalReplayTests {
    @Test("a durable fluxd waits for a store that is down at human speed (queueTimeout 300 s, announced); fluxctl dispatch --wait names the store it still waits for when its own timeout ends first, and the action is applied when the store is back")
    func waitingForAStoreThatIsDown() async throws {
        let data = try TempDirectory(prefix: "fluxdata")
        defer { data.remove() }
        try await withBus(["--data-dir", data.path]) { bus in
        let todo = try await bus.start("todo-store")
        let client = try await bus.connect("limits")
        #expect(client.welcome.limits.queueTimeout == 300_000)
        await client.close()
        try await todo.crash()
        let timedOut = try await fluxctl(["dispatch", "todo/create", #"{"title":"tea"}"#, "--wait", "--timeout", "1"],
                                         socket: bus.socketPath)
        #expect(timedOut.status == 4, "\(timedOut)")
        #expect(timedOut.stderr.contains(#"still waiting for store "todos", which is down (1 action queued"#), "\(timedOut)")
        _ = try await bus.start("todo-store")
        // The queued action reaches the store after it registers: wait (with a deadline) for the state that has it.
        var state = try await fluxctl(["state", "todos", "--json"], socket: bus.socketPath)
        let deadline = ContinuousClock.now + .seconds(20)
        while !state.stdout.contains("tea") && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))  // polling interval; the state decides
            state = try await fluxctl(["state", "todos", "--json"], socket: bus.socketPath)
        }
        #expect(state.stdout.contains("tea"), "\(state)\n\(bus.fluxd.stderr)")
        }
    }

    @Test("SIGTERM on a durable fluxd with a store down: its queued action stays in the journal, said once, with no drain warning (a durable fluxd does not drain by design)")
    func durableStopWithAStoreDown() async throws {
        let data = try TempDirectory(prefix: "fluxdata")
        defer { data.remove() }
        try await withBus(["--data-dir", data.path]) { bus in
            let todo = try await bus.start("todo-store")
            try await todo.crash()
            let sent = try await fluxctl(["dispatch", "todo/create", #"{"title":"kept"}"#], socket: bus.socketPath)
            #expect(sent.status == 0, "\(sent)")
            bus.fluxd.send(signal: SIGTERM)
            #expect(await bus.fluxd.waitForExit(timeout: .seconds(20)) == 0)
            let log = bus.fluxd.stderr
            #expect(log.contains("stopping: 1 action stays accepted in the journal"), "\(log)")
            #expect(!log.contains("drain timeout over"), "\(log)")
            #expect(!log.contains("timeout_ms=0"), "\(log)")
        }
    }

    @Test("an exported journal replayed into a fresh todo-store on an ephemeral bus reproduces the final state, though one action was given up (store down) when journaled")
    func replayReproducesTheSession() async throws {
        let data = try TempDirectory(prefix: "fluxdata")
        defer { data.remove() }
        let work = try TempDirectory(prefix: "fluxreplay")
        defer { work.remove() }
        let file = work.path + "/session.jsonl"
        var final = FluxctlResult(status: 0, stdout: "", stderr: "")
        try await withBus(["--data-dir", data.path, "--queue-timeout", "300"]) { bus in
        var todo = try await bus.start("todo-store")
        func dispatch(_ type: String, _ payload: String) async throws -> FluxctlResult {
            try await fluxctl(["dispatch", type, payload, "--wait", "--json"], socket: bus.socketPath)
        }
        #expect(try await dispatch("todo/create", #"{"title":"milk"}"#).status == 0)
        #expect(try await dispatch("todo/create", #"{"title":"eggs"}"#).status == 0)
        #expect(try await dispatch("todo/toggle", #"{"id":1}"#).status == 0)
        #expect(try await dispatch("todo/toggle", #"{"id":99}"#).status == 1)  // rejected: todo/not-found
        try await todo.crash()
        let givenUp = try await dispatch("todo/create", #"{"title":"bread"}"#)
        #expect(givenUp.status == 1 && givenUp.stdout.contains("unavailable"), "\(givenUp)")
        todo = try await bus.start("todo-store")
        #expect(try await dispatch("todo/create", #"{"title":"jam"}"#).status == 0)

        let export = try await fluxctl(["journal", "--all", "--json"], socket: bus.socketPath)
        #expect(export.status == 0 && export.lines.count == 6, "\(export)")
        #expect(export.lines[4].contains(#""status":"unavailable""#), "\(export)")
        let human = try await fluxctl(["journal", "--tail", "2"], socket: bus.socketPath)
        #expect(human.lines.count == 2 && human.stdout.contains("todo/create") && human.stdout.contains("unavailable"), "\(human)")
        try export.stdout.write(toFile: file, atomically: true, encoding: .utf8)
        final = try await fluxctl(["state", "todos", "--json"], socket: bus.socketPath)
        // A past state: after the first action (seq 1), only milk.
        let past = try await fluxctl(["state", "todos", "--seq", "1", "--json"], socket: bus.socketPath)
        #expect(past.status == 0 && past.stdout.contains("milk") && !past.stdout.contains("eggs"), "\(past)")
        // The same by version (todos' version 2 is the one the first action made); --at is the same option.
        let byVersion = try await fluxctl(["state", "todos", "--version", "2", "--json"], socket: bus.socketPath)
        #expect(byVersion.status == 0 && byVersion.stdout == past.stdout, "\(byVersion)\n\(past)")
        let byAt = try await fluxctl(["state", "todos", "--at", "2", "--json"], socket: bus.socketPath)
        #expect(byAt.stdout == byVersion.stdout, "\(byAt)")
        }

        try await withBus(["--replay"]) { fresh in  // ephemeral
        _ = try await fresh.start("todo-store")
        let replay = try await fluxctl(["replay", file], socket: fresh.socketPath)
        #expect(replay.status == 0, "\(replay)")
        #expect(replay.stdout.contains("replayed 5 actions, skipped 1"), "\(replay)")
        let again = try await fluxctl(["state", "todos", "--json"], socket: fresh.socketPath)
        func stateOf(_ r: FluxctlResult) -> String? {
            guard let data = r.stdout.data(using: .utf8),
                  let o = try? JSONSerialization.jsonObject(with: data) as? [String: Any], let s = o["state"],
                  let d = try? JSONSerialization.data(withJSONObject: s, options: [.sortedKeys]) else { return nil }
            return String(decoding: d, as: UTF8.self)
        }
        #expect(stateOf(again) != nil && stateOf(again) == stateOf(final), "replayed: \(again)\njournaled: \(final)")
        }
    }
}
