import FluxClient
import FluxCore
import FluxStore
import FluxTesting
import Foundation
import Glibc
import Synchronization
import Testing

struct Counter: Codable, Equatable, Sendable { var n = 0 }

func makeCounterStore() -> FluxStore<Counter> {
    let store = FluxStore<Counter>(name: "counter", initial: Counter(), handles: ["count/*"])
    store.on("count/add") { state, _ in state.n += 1 }
    store.on("count/noop") { _, _ in }
    return store
}

/// A transport that delegates to a scripted one but can claim that its write buffer is full and never drains, to
/// show that a request's deadline covers the wait for room.
final class StuckWriter: FluxConnection {
    let inner = ScriptedConnection()
    let stuck = Mutex(false)
    func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) { inner.start(handler) }
    func send(_ bytes: [UInt8]) throws(FluxError) { try inner.send(bytes) }
    func close() { inner.close() }
    var pendingWriteBytes: Int { stuck.withLock { $0 } ? Int.max / 2 : 0 }
    func waitUntilWritable(below limit: Int) async {
        guard stuck.withLock({ $0 }) else { return }
        // Never writable: wait until cancelled.
        let (stream, _) = AsyncStream.makeStream(of: Void.self)
        for await _ in stream {}
    }
}

@Suite("FluxClient: buffering, timeouts, callbacks, status, host operations, limits")
struct ClientDesignTests {
    @Test("a slow consumer sees the newest snapshot, not a backlog; status events are all kept, in order")
    func newestOnlyBuffering() async throws {
        let bus = InMemoryBus()
        let store = makeCounterStore()
        var running = try await bus.start(store)
        let client = try await bus.client()
        let sub = client.subscribe(store: "counter", as: Counter.self)
        var events = sub.makeAsyncIterator()
        // The consumer reads nothing while 200 snapshots are published (each settlement comes after its snapshot).
        for _ in 1...200 { _ = try await client.dispatchAndSettle(type: "count/add") }
        #expect(try await events.next() == .subscribed(.up))
        let newest = try #require(try await events.next()?.snapshot)
        #expect(newest.version == 201)
        #expect(newest.state.n == 200)
        // Nothing else waits: 199 intermediate versions were replaced, never queued.
        await #expect(throws: FluxError.timedOut("store 'counter' sent no new snapshot within 0.1 s")) {
            try await sub.nextSnapshot(timeout: .milliseconds(100))
        }
        #expect(sub.status == SubscriptionStatus(store: "counter", status: .up, version: 201))

        // Status events are never dropped: down, up, and the snapshot after them, while the consumer sleeps.
        try await running.stop()
        running = try await bus.start(store)
        _ = try await client.dispatchAndSettle(type: "count/add")
        _ = try await client.dispatchAndSettle(type: "count/add")
        #expect(try await events.next() == .storeDown(reason: "unregistered"))
        #expect(sub.status?.status == .down)
        #expect(try await events.next() == .storeUp(version: 201))
        #expect(try await events.next()?.snapshot?.version == 203)
        try await running.stop()
    }

    @Test("a request to a store that never answers times out with the timeout error; the client default applies")
    func requestsTimeOut() async throws {
        let bus = InMemoryBus()
        // A store that registers and then never answers an action.
        let raw = RawSession(connection: bus.connect())
        try raw.send(json: #"{"op":"hello","protocol":1,"role":"store","name":"silent"}"#)
        try raw.send(json: #"{"op":"register","store":"silent","handles":["silent/*"],"state":{}}"#)
        var frames = raw.frames.makeAsyncIterator()
        while let body = try await frames.next() {
            if try Envelope(body: body).str("op") == "registered" { break }
        }
        let client = try await FluxClient.connect(over: bus.connect(), name: "impatient", requestTimeout: .milliseconds(150))
        // (The error names the deadline that fired: the client's default. How long it took is not asserted: a
        // loaded machine may run the timer late.)
        // (The settlement's timeout also says what it still waits for, from fluxd's info.)
        await #expect(throws: FluxError.timedOut("the settlement of silent/go (no answer within 0.15 s); still waiting for store \"silent\", which has 1 action to answer before this one")) {
            _ = try await client.dispatchAndSettle(type: "silent/go")
        }
        await #expect(throws: FluxError.timedOut("the settlement of silent/go (no answer within 0.05 s); still waiting for store \"silent\", which has 2 actions to answer before this one")) {
            _ = try await client.dispatchAndSettle(type: "silent/go", timeout: .milliseconds(50))
        }
        // The client still works after a timeout.
        _ = try await client.ping()
        raw.close()
    }

    @Test("the deadline covers the whole call: waiting for write room counts, and nothing is sent late")
    func timeoutCoversTheWholeCall() async throws {
        let connection = StuckWriter()
        async let connecting = FluxClient.connect(over: connection, name: "t")
        _ = try await connection.inner.nextSent(op: "hello")
        connection.inner.reply(welcomeJSON)
        let client = try await connecting
        connection.stuck.withLock { $0 = true }
        do {
            _ = try await client.info(timeout: .milliseconds(100))
            Issue.record("info should time out")
        } catch {
            guard case .timedOut(let what) = error else { Issue.record("\(error)"); return }
            #expect(what.hasPrefix("fluxd's info: "), "\(what)")
            #expect(what.contains("bytes were still waiting to be written to fluxd"), "\(what)")
        }
        #expect(connection.inner.sent.count == 1, "only hello was sent: \(connection.inner.sent)")
        // The handshake has a deadline too.
        let silent = ScriptedConnection()
        await #expect(throws: FluxError.timedOut("fluxd's welcome (handshake) (no answer within 0.1 s)")) {
            _ = try await FluxClient.connect(over: silent, name: "t", requestTimeout: .milliseconds(100))
        }
        #expect(silent.isClosed)
    }

    @Test("subscriber callbacks run with no lock held: a callback that calls back into the client does not deadlock")
    func callbacksMayCallTheClient() async throws {
        let bus = InMemoryBus()
        let running = try await bus.start(makeCounterStore())
        let client = try await bus.client()
        let seen = Recorder<String>()
        let id = client.addSubscriber(store: "counter", deliver: { event in
            guard case .snapshot(let raw) = event else { return }
            // Each of these takes the client's lock; under the lock this would deadlock (or trap).
            let nested = client.subscribe(store: "other", as: Counter.self)
            nested.cancel()
            if raw.version == 2 { _ = try? client.dispatch(type: "count/noop") }
            seen.append("v\(raw.version) \(client.isClosed ? "closed" : "open")")
        }, end: { _ in seen.append("end") })
        #expect(id != nil)
        let dispatcher = Task { try await client.dispatchAndSettle(type: "count/add") }
        _ = try await dispatcher.value
        let lines = try await seen.wait("both snapshots seen") { $0.count >= 2 }
        #expect(lines == ["v1 open", "v2 open"])
        client.removeSubscriber(store: "counter", id: id!)
        _ = try await seen.wait("the end") { $0.last == "end" }
        try await running.stop()
    }

    @Test("subscribing to a store that never registered works; the status says so and a timeout names the reason")
    func unknownStoreStatus() async throws {
        let bus = InMemoryBus()
        let client = try await bus.client()
        let sub = client.subscribe(store: "counter", as: Counter.self)
        await #expect(throws: FluxError.timedOut("no store named 'counter' has registered yet (no snapshot of it within 0.1 s)")) {
            try await sub.nextSnapshot(timeout: .milliseconds(100))
        }
        #expect(sub.status == SubscriptionStatus(store: "counter", status: .unknown, version: 0))
        #expect(sub.status?.description == "no store named 'counter' has registered yet")
        // The subscription is still in place: once the store registers, its snapshot arrives.
        let running = try await bus.start(makeCounterStore())
        let first = try await sub.nextSnapshot()
        #expect(first.version == 1)
        var events = sub.makeAsyncIterator()
        _ = try await client.dispatchAndSettle(type: "count/add")
        // store-up came before the snapshot we took; the next event is the next snapshot.
        #expect(try await events.next()?.snapshot?.state.n == 1)
        #expect(sub.status?.status == .up)
        try await running.stop()
    }

    @Test("typed host operations: workers, restartWorker, stopWorker decode fluxd's replies; errors are typed")
    func hostOperations() async throws {
        let (client, fake) = try await connectScripted()
        async let listing = client.workers()
        let w = try await fake.nextSent(op: "workers")
        let id = try #require(w.str("id"))
        fake.reply(#"{"op":"workers","id":"\#(id)","workers":[{"name":"todo","state":"running","pid":4242,"restarts":1,"uptime_ms":5120,"last_exit":{"signal":"SIGKILL"},"stores":["todos"],"error":"killed by SIGKILL"},{"name":"crasher","state":"backing-off","pid":null,"restarts":3,"uptime_ms":null,"last_exit":{"code":3},"stores":[]},{"name":"new","state":"hibernating","pid":null,"restarts":0,"uptime_ms":null,"last_exit":null,"stores":["a","b"],"future":true}]}"#)
        let workers = try await listing
        #expect(workers.map(\.name) == ["todo", "crasher", "new"])
        #expect(workers[0].state == .running)
        #expect(workers[0].pid == 4242)
        #expect(workers[0].restarts == 1)
        #expect(workers[0].uptimeMilliseconds == 5120)
        #expect(workers[0].lastExit == .signal("SIGKILL"))
        #expect(workers[0].stores == ["todos"])
        #expect(workers[0].error == "killed by SIGKILL")
        #expect(workers[1].state == .backingOff)
        #expect(workers[1].pid == nil)
        #expect(workers[1].lastExit == .code(3))
        #expect(workers[2].state == .other("hibernating"))
        #expect(workers[2].lastExit == nil)
        #expect(String(decoding: workers[2].json, as: UTF8.self).contains(#""future":true"#))

        async let restarting = client.restartWorker("todo")
        let r = try await fake.nextSent(op: "restart-worker")
        #expect(r.str("name") == "todo")
        fake.reply(#"{"op":"worker","id":"\#(r.str("id")!)","worker":{"name":"todo","state":"stopping","pid":4242,"restarts":1,"uptime_ms":9000,"last_exit":null,"stores":["todos"]}}"#)
        let restarted = try await restarting
        #expect(restarted.state == .stopping)

        async let stopping = client.stopWorker("nope")
        let s = try await fake.nextSent(op: "stop-worker")
        fake.reply(#"{"op":"error","code":"unknown-worker","ref":"\#(s.str("id")!)","message":"no worker named \"nope\""}"#)
        do {
            _ = try await stopping
            Issue.record("stopWorker should fail")
        } catch {
            #expect((error as? FluxError)?.code == .unknownWorker)
        }
        await #expect(throws: FluxError.invalidArgument("bad worker name \"a b\"")) { _ = try await client.stopWorker("a b") }

        // A fluxd that hosts no workers (here the in-memory bus) refuses with unknown-op.
        let bus = InMemoryBus()
        let busClient = try await bus.client()
        do {
            _ = try await busClient.workers()
            Issue.record("workers should fail on a bus without workers")
        } catch {
            #expect(error.code == .unknownOp)
        }
    }

    @Test("Limits has every key of welcome.limits (FluxCore.LimitName); Counters has connections")
    func limitsAndCounters() async throws {
        let fake = ScriptedConnection()
        async let connecting = FluxClient.connect(over: fake, name: "t")
        _ = try await fake.nextSent(op: "hello")
        let limits = LimitName.allCases.enumerated().map { #""\#($0.element.rawValue)":\#($0.offset + 1)"# }.joined(separator: ",")
        fake.reply(#"{"op":"welcome","protocol":1,"server":"fake/1","peer":7,"limits":{\#(limits)}}"#)
        let client = try await connecting
        for (offset, name) in LimitName.allCases.enumerated() {
            #expect(client.welcome.limits[name] == offset + 1, "\(name)")
        }
        #expect(client.welcome.limits.maxBacklog != nil)

        async let info = client.info()
        let i = try await fake.nextSent(op: "info")
        fake.reply(#"{"op":"info","id":"\#(i.str("id")!)","seq":1,"stores":[{"name":"s","status":"up","stalled":true,"stalledFor":1500}],"peers":{"client":1,"store":0,"monitor":0},"counters":{"connections":9,"framesIn":1,"framesOut":1,"bytesIn":1,"bytesOut":1,"actions":0,"snapshots":0,"errors":{}},"load":{"connections":2,"acceptErrors":{"EMFILE":3}},"memory":{"used":10,"users":[{"uid":null,"bytes":10,"connections":1}]},"extra":1}"#)
        let busInfo = try await info
        #expect(busInfo.counters?.connections == 9)
        #expect(busInfo[store: "s"]?.stalled == true)
        #expect(busInfo[store: "s"]?.stalledFor == 1500)
        #expect(busInfo.load?.acceptErrors?["EMFILE"] == 3)
        #expect(busInfo.memory?.users?.first?.uid == nil)
        #expect(String(decoding: busInfo.json, as: UTF8.self).hasSuffix(#""extra":1}"#))
    }

    @Test("SocketConnection: send never blocks; bytes wait for the writer thread; waitUntilWritable resumes as it drains")
    func socketWritesDoNotBlock() async throws {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let connection = SocketConnection(fileDescriptor: fds[0])
        connection.start { _ in }
        defer { connection.close() }
        let total = 16 << 20
        let chunk = [UInt8](repeating: 7, count: 1 << 20)
        for _ in 0..<(total / chunk.count) { try connection.send(chunk) }
        // Nobody reads the other end yet: a blocking send would have stalled here for good (the suite's time
        // limit would end the run); instead the bytes wait for the writer thread.
        #expect(connection.pendingWriteBytes > 0)
        let far = fds[1]
        let reader = Task.detached { () -> Int in
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            var got = 0
            while got < total {
                let n = buffer.withUnsafeMutableBytes { read(far, $0.baseAddress, $0.count) }
                if n <= 0 { break }
                got += n
            }
            return got
        }
        await connection.waitUntilWritable(below: 1)
        #expect(connection.pendingWriteBytes == 0)
        #expect(await reader.value == total)
        Glibc.close(far)
    }

    @Test("connecting to a directory says so, and does not suggest starting fluxd on the directory")
    func connectingToADirectory() throws {
        let dir = NSTemporaryDirectory() + "fluxbus-dir-\(getpid())"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        do {
            _ = try SocketConnection(path: dir)
            Issue.record("connect should fail")
        } catch {
            guard case .cannotConnect(let problem) = error else { Issue.record("\(error)"); return }
            #expect(problem.problem == .isDirectory)
            #expect(problem.description.hasPrefix("no fluxd at \(dir) (from the given path): it is a directory, not a socket\n"))
            #expect(problem.description.contains("fluxd --socket \(dir)/fluxd.sock"))
            #expect(!problem.description.contains("fluxd --socket \(dir)\n"))
        }
        // A regular file is not a socket either.
        let file = dir + "/plain"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        #expect(throws: FluxError.self) { _ = try SocketConnection(path: file) }
        do { _ = try SocketConnection(path: file) } catch {
            if case .cannotConnect(let p) = error { #expect(p.problem == .notASocket) } else { Issue.record("\(error)") }
        }
    }
}
