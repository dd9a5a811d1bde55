// flux-large-state-bench: benchmark workload 8 (issue 16, large states) for the Swift SDK, one role per process.
// Benchmarks/run.py starts a fluxd, one store, 10 clients and drives them; each process reports its own CPU
// (getrusage: user + system, all threads) and the bytes it received, as one JSON line on exit.
//
//   flux-large-state-bench store  --socket S [--todos 10000] [--full] [--name todos]
//       The example todo store (TodoModel.TodoState, its todos a TrackedArray) seeded with N todos, with a
//       `todo/toggle` handler of a few lines like examples/todo/Store's. Prints {"role":"store","ready":true} once
//       registered; then, when its standard input ends (or gets a line), {"role":"store", "actions",
//       "cpu_us_per_action" (CPU from the first action on / actions), "bytes_sent_per_action",
//       "bytes_received_per_action", ...} and exits.
//   flux-large-state-bench client --socket S [--todos 10000] [--full] [--name todos] --actions A
//       Subscribes with the typed API (`subscribe(store:as: TodoState.self)`), and after each change reads the
//       toggled todo through it (the driver toggles id n % N + 1 with seq n + 1: the todo at (seq - 1) % N).
//       Prints {"role":"client","ready":true,"first_state_ms"} once it holds the first state (ms from `subscribe`
//       to the decoded state), then, once it holds the state of action A (snapshot seq >= A), {"role":"client",
//       "changes" (states received), "versions", "cpu_us_per_change", "bytes_per_change", "bytes_received",
//       "consistent", ...}
//       and exits. --actions 0: only the first state (a new subscriber's time to the whole state).
//
// --full ("before"): the process hides SPEC §16 from the SDK: its transport drops `deltaHistory` from fluxd's
// `welcome.limits`, so FluxStore and FluxClient do what they do with a fluxd before 0.4.0: the store publishes
// every new state whole (`done.state`, FluxJSON.encode of the whole TodoState) and subscribers subscribe without
// deltas (every change a whole snapshot, parsed and decoded whole). FluxStore has no option of its own for this.
// Without --full ("after"): patches from the TrackedArray's log (`done.patch`), delta subscriptions, incremental
// decoding.

import FluxClient
import FluxJSONValue
import FluxStore
import Foundation
import Synchronization
import TodoModel

// MARK: - Measuring

/// This process's CPU time (user + system, every thread), in µs.
func cpuMicros() -> Double {
    var usage = rusage()
    getrusage(Int32(RUSAGE_SELF.rawValue), &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e6
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec)
}

func monotonicMillis() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) * 1e3 + Double(ts.tv_nsec) / 1e6
}

/// Prints one JSON object on one line, unbuffered (the driver waits for it).
func emit(_ fields: [String: Any]) {
    let data = try! JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])
    FileHandle.standardOutput.write(data + Data("\n".utf8))
}

func round1(_ x: Double) -> Double { (x * 10).rounded() / 10 }

/// Bytes through one connection (frames with their 4-byte length prefix).
final class ByteCounter: Sendable {
    private let counts = Mutex<(received: Int, sent: Int)>((0, 0))
    func received(_ n: Int) { counts.withLock { $0.received += n } }
    func sent(_ n: Int) { counts.withLock { $0.sent += n } }
    var received: Int { counts.withLock { $0.received } }
    var sent: Int { counts.withLock { $0.sent } }
}

/// A socket connection that counts bytes and, with `hideDeltas`, removes `limits.deltaHistory` from fluxd's
/// `welcome`: the SDK then takes fluxd for one without SPEC §16 (no patches, no delta subscriptions).
final class BenchConnection: FluxConnection {
    let inner: SocketConnection
    let counter: ByteCounter
    let hideDeltas: Bool

    init(path: String, counter: ByteCounter, hideDeltas: Bool) throws(FluxError) {
        inner = try SocketConnection(path: path)
        self.counter = counter
        self.hideDeltas = hideDeltas
    }

    func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) {
        let counter = self.counter, hide = hideDeltas
        let welcomed = Mutex(false)
        inner.start { event in
            guard case .frame(let body) = event else { return handler(event) }
            counter.received(body.count + 4)
            if hide, !welcomed.withLock({ $0 }) {
                welcomed.withLock { $0 = true }
                return handler(.frame(Self.withoutDeltaHistory(body)))
            }
            handler(event)
        }
    }

    static func withoutDeltaHistory(_ body: [UInt8]) -> [UInt8] {
        guard case .object(var members)? = try? JSONValue(parsing: body),
              members.contains(where: { $0.key == "op" && $0.value == .string("welcome") }),
              let i = members.firstIndex(where: { $0.key == "limits" }),
              case .object(let limits) = members[i].value else { return body }
        members[i].value = .object(limits.filter { $0.key != "deltaHistory" })
        return JSONValue.object(members).compactBytes
    }

    func send(_ bytes: [UInt8]) throws(FluxError) {
        counter.sent(bytes.count)
        try inner.send(bytes)
    }

    func close() { inner.close() }
    var pendingWriteBytes: Int { inner.pendingWriteBytes }
    func waitUntilWritable(below limit: Int) async { await inner.waitUntilWritable(below: limit) }
}

// MARK: - Arguments

struct Options {
    var role = ""
    var socket = ""
    var todos = 10_000
    var actions = 0
    var full = false
    var name = TodoStores.todos

    init(_ arguments: [String]) {
        var args = arguments.dropFirst()
        role = args.popFirst() ?? ""
        while let a = args.popFirst() {
            switch a {
            case "--socket": socket = args.popFirst() ?? ""
            case "--todos": todos = Int(args.popFirst() ?? "") ?? -1
            case "--actions": actions = Int(args.popFirst() ?? "") ?? -1
            case "--name": name = args.popFirst() ?? ""
            case "--full": full = true
            default: Self.usage("unknown argument \(a)")
            }
        }
        guard ["store", "client"].contains(role) else { Self.usage("role must be store or client") }
        guard !socket.isEmpty, todos > 0, actions >= 0, !name.isEmpty else { Self.usage("bad arguments") }
    }

    static func usage(_ why: String) -> Never {
        FileHandle.standardError.write(Data("flux-large-state-bench: \(why)\nusage: flux-large-state-bench store|client --socket S [--todos N] [--actions A] [--full] [--name STORE]\n".utf8))
        exit(2)
    }

    var mode: String { full ? "full" : "deltas" }
}

/// The seeded state: N todos of ~86 bytes of JSON each (10,000: ~860 KB), as the Python and Node benchmarks seed.
func seededState(_ n: Int) throws -> TodoState {
    var state = TodoState()
    for i in 1...n { try state.create(title: "todo number \(i): buy milk and eggs", seq: i) }
    return state
}

/// Resolves once standard input has a line or ends (read on a thread of its own: it blocks).
func standardInputEnds() async {
    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
        Thread.detachNewThread {
            _ = readLine()
            done.resume()
        }
    }
}

// MARK: - Roles

/// What the store's handler counts: actions handled, and the CPU clock at the first one.
final class StoreTally: Sendable {
    private let tally = Mutex<(actions: Int, startCPU: Double)>((0, 0))
    func action() {
        tally.withLock { t in
            if t.actions == 0 { t.startCPU = cpuMicros() }
            t.actions += 1
        }
    }
    var snapshot: (actions: Int, startCPU: Double) { tally.withLock { $0 } }
}

func runStore(_ o: Options) async throws {
    let counter = ByteCounter()
    let tally = StoreTally()
    let store = FluxStore<TodoState>(name: o.name, initial: try seededState(o.todos), handles: [TodoActions.all])
    // The example's toggle handler (examples/todo/Store), counting what it handles.
    store.on(TodoActions.toggle, as: ToggleTodo.self) { state, action, _ in
        tally.action()
        do throws(TodoRejection) {
            try state.toggle(id: action.id)
        } catch {
            throw StoreRejection(code: error.code, message: error.message)
        }
    }
    let socket = o.socket, full = o.full
    let running = Task {
        try await store.run(peerName: "large-state-store", reconnect: .disabled) { () throws(FluxError) in
            try BenchConnection(path: socket, counter: counter, hideDeltas: full)
        }
    }
    try await store.ready()
    let receivedBefore = counter.received, sentBefore = counter.sent
    emit(["role": "store", "ready": true, "registered_bytes_sent": sentBefore])
    await standardInputEnds()
    let end = cpuMicros()
    let t = tally.snapshot
    let n = max(t.actions, 1)
    emit(["role": "store", "lang": "swift", "mode": o.mode, "todos": o.todos, "actions": t.actions,
          "cpu_us_per_action": round1((end - t.startCPU) / Double(n)),
          "bytes_sent_per_action": round1(Double(counter.sent - sentBefore) / Double(n)),
          "bytes_received_per_action": round1(Double(counter.received - receivedBefore) / Double(n))])
    running.cancel()
    _ = await running.result
}

func runClient(_ o: Options) async throws {
    let counter = ByteCounter()
    let socket = o.socket, full = o.full
    let client = try await FluxClient.connect(name: "large-state-client", reconnect: .disabled) { () throws(FluxError) in
        try BenchConnection(path: socket, counter: counter, hideDeltas: full)
    }
    let t0 = monotonicMillis()
    let subscription = client.subscribe(store: o.name, as: TodoState.self)
    var iterator = subscription.makeAsyncIterator()
    var first: Snapshot<TodoState>?
    while first == nil, let event = try await iterator.next() { first = event.snapshot }
    guard let first else { throw FluxError.disconnected("the subscription ended before a state") }
    let firstStateMs = monotonicMillis() - t0
    emit(["role": "client", "ready": true, "first_state_ms": round1(firstStateMs), "version": first.version,
          "todos_held": first.state.todos.count])
    let startCPU = cpuMicros(), startBytes = counter.received
    var changes = 0
    var last = first
    var readsDone = 0, wrongReads = 0
    while o.actions > 0 && last.seq < o.actions, let event = try await iterator.next() {
        guard let snap = event.snapshot else { continue }
        changes += 1
        last = snap
        // Read the toggled todo through the typed state: the action with seq s toggled id (s - 1) % N + 1.
        let index = (snap.seq - 1) % o.todos
        let todo = snap.state.todos[index]
        if todo.id != index + 1 { wrongReads += 1 }
        if todo.done { readsDone += 1 }
    }
    let cpu = cpuMicros() - startCPU
    let bytes = counter.received - startBytes
    // After A toggles of ids 1...A (A <= N): exactly the first A todos are done (each toggled once per pass).
    let expectedDone = o.actions >= o.todos ? nil : o.actions
    let doneCount = last.state.todos.count { $0.done }
    let consistent = wrongReads == 0 && (expectedDone.map { doneCount == $0 } ?? true)
    let n = max(changes, 1)
    emit(["role": "client", "lang": "swift", "mode": o.mode, "first_state_ms": round1(firstStateMs),
          "changes": changes, "versions": last.version - first.version, "last_seq": last.seq,
          "cpu_us_per_change": round1(cpu / Double(n)), "bytes_per_change": round1(Double(bytes) / Double(n)),
          "bytes_received": bytes,
          "reads_done": readsDone, "done_count": doneCount, "consistent": consistent])
    subscription.cancel()
    await client.close()
    if !consistent { exit(1) }
}

let options = Options(CommandLine.arguments)
do {
    if options.role == "store" { try await runStore(options) } else { try await runClient(options) }
} catch {
    FileHandle.standardError.write(Data("flux-large-state-bench \(options.role): \(error)\n".utf8))
    exit(1)
}
