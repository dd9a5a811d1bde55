import FluxClient
import FluxCore
import FluxJournal
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

    /// Kills fluxd (SIGKILL: a crash), lets `edit` change the data directory (e.g. cut the journal as a crash at
    /// another moment would have), then starts fluxd again on the same socket and data directory.
    func crashAndRestart(editing edit: (String) throws -> Void) async throws {
        let old = fluxd
        old.send(signal: SIGKILL)
        _ = await old.waitForExit(timeout: .seconds(20))
        await old.shutDown()
        try edit(dataDirectory)
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

/// The journal's newest segment under `dataDirectory` (`journal-NNNNNNNN.fjl`, docs/journal.md).
private func newestSegment(in dataDirectory: String) throws -> String {
    let files = FileManager.default.enumerator(atPath: dataDirectory)?.compactMap { $0 as? String } ?? []
    let segments = files.filter { ($0 as NSString).lastPathComponent.hasPrefix("journal-") && $0.hasSuffix(".fjl") }.sorted {
        ($0 as NSString).lastPathComponent < ($1 as NSString).lastPathComponent
    }
    guard let last = segments.last else { throw HarnessError.unexpectedOutput("no journal segment in \(dataDirectory): \(files)") }
    return dataDirectory + "/" + last
}

/// Makes the segment's last record hold the store's new state without its `done` result: what a crash between the
/// two left in a format-3 journal. (Since format version 4 fluxd writes a store's new state and its `done` for the
/// action as one record, `stateFixed` with the done flag, in the loop iteration's batch: this clears the flag and
/// seals the batch again.) Returns whether the last record was such a batch.
private func dropLastDone(of path: String) throws -> Bool {
    var data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    guard let last = JournalScan(data).records.last, data[last.lowerBound] == RecordKind.batch.rawValue else { return false }
    var at = last.lowerBound + 1
    var inner = -1
    while at + 4 <= last.upperBound {
        let n = data[at..<(at + 4)].reversed().reduce(0) { $0 << 8 | Int($1) }
        inner = at + 4
        at += 4 + n
    }
    guard inner >= 0, data[inner] == RecordKind.stateFixed.rawValue, data[inner + 1] & 2 != 0 else { return false }
    data[inner + 1] &= ~2
    let crc = CRC32C.checksum(data[last])
    for i in 0..<4 { data[last.lowerBound - 4 + i] = UInt8(truncatingIfNeeded: crc >> (24 - 8 * UInt32(i))) }
    try Data(data).write(to: URL(fileURLWithPath: path))
    return true
}

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
            // One log format and each event once (issue 26): every line the store process wrote is in fluxd's format
            // (time with milliseconds, level, label), and the loss and the reconnection are logged once each.
            let lines = store.stderr.split(separator: "\n").map(String.init)
            let format = #/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (trace|debug|info|notice|warning|error|critical) [^ ]+: /#
            #expect(lines.allSatisfy { $0.contains(format) }, "\(store.stderr)")
            #expect(lines.filter { $0.contains("connection to fluxd lost") }.count == 1, "\(store.stderr)")
            #expect(lines.filter { $0.contains("reconnected to fluxd") }.count == 1, "\(store.stderr)")
            #expect(lines.contains { $0.contains(" info todos: registered on ") }, "\(store.stderr)")
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

    @Test("rule 2 on a real fluxd: an action redelivered after a crash between its state and its result is skipped by the live store")
    func redeliveredActionAlreadyInTheSnapshotIsSkipped() async throws {
        try await withRestartableBus { bus in
            let store = try await bus.start("todo-store", readyLine: "todo-store ready")
            let client = try await bus.connect("view")
            let events = EventLog(client.connectivityEvents())
            let sub = EventLog(client.subscribeJSON(store: "todos"))
            let milk = try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "milk")).requireDone()
            try await sub.wait("version 2") { $0.contains { $0.snapshot?.version == 2 } }

            // The journal holds the state (version 2, seq of milk) but not the result: as a crash between the two
            // left it before format version 4.
            var split = false
            try await bus.crashAndRestart { data in split = try dropLastDone(of: newestSegment(in: data)) }
            #expect(split, "the last record was the state and result of todo/create")
            try await events.wait("the client reconnected") { $0.contains(.reconnected(epochChanged: false)) }

            // The store adopts version 2 (seq of milk) and is sent milk again, marked redelivered: it answers done
            // without its handler. Then eggs: version 3, the list holds milk once.
            let eggs = try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "eggs")).requireDone()
            #expect(eggs.seq > milk.seq)
            #expect(eggs.results.first?.status == .done(version: 3), "milk made no new version when it came again")
            let got = try await client.getJSON(store: "todos")
            let state = String(decoding: got.state.bytes, as: UTF8.self)
            #expect(state.components(separatedBy: "milk").count == 2, "milk once: \(state)")
            #expect(state.contains("eggs"))
            #expect(!store.stderr.contains("(redelivered)"), "the handler did not run again:\n\(store.stderr)")
            let seen = try await sub.wait("version 3") { $0.contains { $0.snapshot?.version == 3 } }
            // Version 1 may have been replaced by 2 before it was read (newest wins); none comes twice.
            let versions = seen.compactMap { $0.snapshot?.version }
            #expect(versions.suffix(2) == [2, 3] && versions == versions.sorted() && Set(versions).count == versions.count,
                    "\(versions)")
            await client.close()
        }
    }
}

/// Seqs across restarts (issue 26): a clean stop continues at the next seq; a crash skips the reserved block (never
/// reusing a seq); `info.seq` is the last action's seq either way.
@Suite("seqs across restarts", .serialized)
struct SeqAcrossRestartTests {
    @Test("5 actions, SIGTERM, start: info.seq 5 and the next action gets 6; then SIGKILL, start: info.seq still the last, the next above the reserved block")
    func cleanRestartContinues() async throws {
        try await withRestartableBus { bus in
            let first = try await bus.start("todo-store", readyLine: "todo-store ready")
            var client = try await bus.connect("seqs")
            var last = 0
            for i in 1...5 {
                let s = try await client.dispatchAndSettle(type: "todo/create", payload: ["title": "t\(i)"])
                last = s.seq
            }
            #expect(last == 5)
            await first.shutDown()
            try await bus.restart()
            client = try await bus.connect("seqs-after-clean")
            #expect(try await client.info().seq == 5)
            let second = try await bus.start("todo-store", readyLine: "todo-store ready")
            let next = try await client.dispatchAndSettle(type: "todo/create", payload: ["title": "after"])
            #expect(next.seq == 6, "a clean restart continues at the next seq:\n\(bus.fluxd.stderr)")
            await second.shutDown()
            try await bus.crashAndRestart(editing: { _ in })
            client = try await bus.connect("seqs-after-crash")
            #expect(try await client.info().seq == 6, "info.seq is the last action's, not the reserved block's edge")
            _ = try await bus.start("todo-store", readyLine: "todo-store ready")
            let afterCrash = try await client.dispatchAndSettle(type: "todo/create", payload: ["title": "crash"])
            #expect(afterCrash.seq > 65_536, "after a crash the seqs of the reserved block are skipped")
        }
    }
}

/// fluxctl's streams across a fluxd restart (issue 26): `watch` and `monitor --record` keep going, say in one line
/// when fluxd goes and comes back, and the record marks the gap.
@Suite("fluxctl streams across a restart")
struct FluxctlStreamReconnectTests {
    @Test("watch and monitor --record through a SIGTERM restart: one line each way, the record keeps going with a gap mark; --no-reconnect exits 3")
    func streamsSurviveARestart() async throws {
        let directory = try TempDirectory(prefix: "fluxrec")
        defer { directory.remove() }
        let record = directory.path + "/session.jsonl"
        try await withRestartableBus { bus in
            _ = try await bus.start("todo-store", readyLine: "todo-store ready")
            let monitor = try FluxctlProcess(["monitor", "--time", "none", "--record", record], socket: bus.socketPath)
            defer { monitor.cleanup() }
            let watch = try FluxctlProcess(["watch", "todos"], socket: bus.socketPath)
            defer { watch.cleanup() }
            let quitter = try FluxctlProcess(["watch", "todos", "--no-reconnect"], socket: bus.socketPath)
            defer { quitter.cleanup() }
            try await watch.wait("the retained state") { $0.contains("version 1") }
            try await quitter.wait("the retained state") { $0.contains("version 1") }
            let client = try await bus.connect("probe")
            for _ in 0..<200 where (try await client.info().peers?.monitor ?? 0) < 3 {
                try await Task.sleep(for: .milliseconds(20))  // polling interval: fluxd's count decides
            }
            await client.close()
            #expect(try await fluxctl(["dispatch", "todo/create", #"{"title":"before"}"#, "--wait"], socket: bus.socketPath).status == 0)
            try await monitor.wait("the first dispatch") { $0.contains(#"{"title":"before"}"#) }

            try await bus.restart()
            try await watch.wait("fluxd back") { $0.contains("fluxd is back (the same history") }
            try await monitor.wait("fluxd back") { $0.contains("fluxd is back (the same history") }
            #expect(watch.stdout.contains("fluxd said bye (restart); waiting for fluxd to come back"), "\(watch.stdout)")
            let quit = try await quitter.finish()
            #expect(quit.status == 3, "\(quit)")

            #expect(try await fluxctl(["dispatch", "todo/create", #"{"title":"after"}"#, "--wait"], socket: bus.socketPath).status == 0)
            try await monitor.wait("the second dispatch") { $0.contains(#"{"title":"after"}"#) }
            try await watch.wait("the second todo") { $0.contains("after") }
            let lines = try String(contentsOfFile: record, encoding: .utf8).split(separator: "\n").map(String.init)
            #expect(lines.count == 3, "\(lines)")
            #expect(lines.first?.contains(#""title":"before""#) == true)
            #expect(lines.dropFirst().first?.hasPrefix(#"{"gap":{"reason":"#) == true, "\(lines)")
            #expect(lines.last?.contains(#""title":"after""#) == true)
            // The record replays as before: the gap line is skipped.
            let dry = try await fluxctl(["dispatch", "--file", record, "--json"], socket: bus.socketPath)
            #expect(dry.status == 0 && dry.stdout.split(separator: "\n").count == 2, "\(dry)")
        }
    }
}
