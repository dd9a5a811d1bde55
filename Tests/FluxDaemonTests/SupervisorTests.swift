import FluxCore
@testable import FluxDaemon
import FluxRouter
import FluxTransport
import Foundation
import Glibc
import Testing

/// The Supervisor's state machine with a fake spawner, a fake clock and fake stores: no processes, no sockets, no
/// waiting. Each test says which process ends how, which store comes up or goes down, and how much time passes.
@Suite("Supervisor: start order, registration and dependencies")
struct SupervisorStartTests {
    @Test("workers start in dependency order: a worker waits until the stores it comes after are up")
    func dependencyOrder() {
        let todo = worker("todo", stores: ["todos"])
        let stats = worker("stats", stores: ["stats"], after: ["todos"])
        let h = SupervisorHarness([todo, stats])
        h.supervisor.start()
        #expect(h.spawner.attempts == ["/bin/todo"])
        #expect(h.state("todo") == .starting)
        #expect(h.state("stats") == .starting)
        #expect(h.status("stats")?.pid == nil)

        h.register(todo)
        #expect(h.state("todo") == .running)
        #expect(h.spawner.attempts == ["/bin/todo", "/bin/stats"], "stats starts once todos is up")
        #expect(h.state("stats") == .starting, "until it registered its own store")

        h.register(stats)
        #expect(h.state("stats") == .running)
        #expect(h.clock.armed.isEmpty, "no start timeout left armed")
        #expect(h.log.contains("worker running"))
    }

    @Test("a worker is started with FLUXBUS_SOCKET, its env, its cwd, its args and --socket PATH, in a session of its own")
    func spawnOptions() {
        let todo = worker("todo", stores: ["todos"], arguments: ["--fast"]) {
            $0.environment = ["TODO_MODE": "test"]
            $0.workingDirectory = "/srv/todo"
        }
        let plain = worker("plain", arguments: ["x"]) { $0.socketArgument = false }
        let h = SupervisorHarness([todo, plain])
        h.supervisor.start()
        let options = h.spawner.latest("/bin/todo")!.options
        #expect(options.executable == "/bin/todo")
        #expect(options.arguments == ["--fast", "--socket", SupervisorHarness.socketPath])
        #expect(options.environment.contains("FLUXBUS_SOCKET=\(SupervisorHarness.socketPath)"))
        #expect(options.environment.contains("TODO_MODE=test"))
        #expect(options.environment == options.environment.sorted())
        #expect(options.workingDirectory == "/srv/todo")
        #expect(options.detached)
        #expect(h.spawner.latest("/bin/plain")!.options.arguments == ["x"], "socket_arg = false")
    }

    @Test("a worker without stores counts as running once started")
    func noStoresRunsAtOnce() {
        let h = SupervisorHarness([worker("cron")])
        h.supervisor.start()
        #expect(h.state("cron") == .running)
        #expect(h.status("cron")?.pid == 100)
        #expect(h.clock.armed.isEmpty)
    }

    @Test("a worker that does not register within start_timeout gets SIGTERM, SIGKILL after stop_timeout, and is restarted as failed")
    func startTimeout() {
        let todo = worker("todo", stores: ["todos"]) {
            $0.startTimeout = 3000
            $0.stopTimeout = 1000
        }
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        let first = h.spawner.latest("/bin/todo")!
        h.clock.advance(by: 2999)
        #expect(first.signals.isEmpty)
        h.clock.advance(by: 1)
        #expect(first.signals == [SIGTERM])
        #expect(h.state("todo") == .starting)
        #expect(h.log.contains("did not register its stores within the start timeout"))
        h.clock.advance(by: 1000)
        #expect(first.signals == [SIGTERM, SIGKILL], "it ignored SIGTERM")

        h.exit(todo, .signalled(SIGKILL))
        #expect(h.status("todo") == .init(state: .backingOff, pid: nil, restarts: 1, lastExit: .signalled(SIGKILL),
                                          lastError: "did not register todos within 3000 ms"))
        h.clock.advance(by: 199)
        #expect(h.spawner.attempts.count == 1)
        h.clock.advance(by: 1)
        #expect(h.spawner.attempts.count == 2, "restarted after the first backoff delay")
        #expect(h.state("todo") == .starting)
    }

    @Test("registering in time disarms the start timeout")
    func registeredInTime() {
        let todo = worker("todo", stores: ["todos"]) { $0.startTimeout = 3000 }
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        h.clock.advance(by: 2000)
        h.register(todo)
        h.clock.advance(by: 60_000)
        #expect(h.state("todo") == .running)
        #expect(h.spawner.latest("/bin/todo")!.signals.isEmpty)
    }

    @Test("a restarted worker counts as registered only once its stores are owned by a new connection, not the old one's that is still closing")
    func staleOwnerIsNotARegistration() {
        let todo = worker("todo", stores: ["todos"])
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        h.register(todo) // owner 100
        // It crashes; fluxd has not processed its connection's close yet: todos is still up, owned by 100.
        h.exit(todo, .exited(1), storesGoDown: false)
        h.clock.advance(by: 200)
        #expect(h.spawner.attempts.count == 2)
        h.storeUp("unrelated", owner: 7)
        #expect(h.state("todo") == .starting, "todos is up, but owned by the old process")
        h.storeDown("todos")
        #expect(h.state("todo") == .starting)
        #expect(h.spawner.latest("/bin/todo")!.signals.isEmpty, "a store going down before registration kills nothing")
        h.register(todo) // owner 101
        #expect(h.state("todo") == .running)
    }

    @Test("a running worker whose store goes down while the process lives is killed and restarted as failed")
    func storeDownWhileAlive() {
        let todo = worker("todo", stores: ["todos"]) { $0.stopTimeout = 1000 }
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        h.register(todo)
        let process = h.spawner.latest("/bin/todo")!
        h.storeDown("todos")
        #expect(process.signals == [SIGTERM])
        #expect(h.log.contains("worker lost its connection; killing it"))
        h.clock.advance(by: 1000)
        #expect(process.signals == [SIGTERM, SIGKILL])
        h.exit(todo, .signalled(SIGKILL), storesGoDown: false)
        #expect(h.state("todo") == .backingOff)
        #expect(h.status("todo")?.lastError == "store todos went down while the process lived")
    }

    @Test("a stalled store's worker is SIGKILLed (restarted as after a crash); another pid is not ours")
    func killStalled() {
        let todo = worker("todo", stores: ["todos"])
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        h.register(todo)
        let process = h.spawner.latest("/bin/todo")!
        #expect(h.supervisor.killStalled(pid: process.pid, store: "todos"))
        #expect(process.signals == [SIGKILL])
        #expect(!h.supervisor.killStalled(pid: 4242, store: "todos"))
        h.exit(todo, .signalled(SIGKILL))
        #expect(h.state("todo") == .backingOff)
    }

    @Test("a worker's output lines are logged with its name and stream")
    func outputIsLogged() {
        let h = SupervisorHarness([worker("cron")])
        h.supervisor.start()
        h.spawner.latest("/bin/cron")!.write("tick 1", to: .stderr)
        let line = h.log.lines.first { $0.message == "cron| tick 1" }
        #expect(line?.metadata["worker"] == "cron")
        #expect(line?.metadata["stream"] == "stderr")
    }
}

/// One way a worker ends, the restart policy in force, and what follows.
struct PolicyCase: Sendable, CustomTestStringConvertible {
    var policy: RestartPolicy
    var exit: ProcessExit
    var restarted: Bool
    var state: WorkerState
    var lastError: String?

    var testDescription: String { "restart = \(policy.rawValue), \(exit) -> \(state.rawValue)" }
}

@Suite("Supervisor: restart policies, backoff and the intensity limit")
struct SupervisorRestartTests {
    @Test("restart policies", arguments: [
        PolicyCase(policy: .always, exit: .exited(0), restarted: true, state: .backingOff, lastError: "exit status 0"),
        PolicyCase(policy: .always, exit: .signalled(SIGKILL), restarted: true, state: .backingOff, lastError: "killed by SIGKILL"),
        PolicyCase(policy: .onFailure, exit: .exited(0), restarted: false, state: .stopped, lastError: nil),
        PolicyCase(policy: .onFailure, exit: .exited(3), restarted: true, state: .backingOff, lastError: "exit status 3"),
        PolicyCase(policy: .onFailure, exit: .signalled(SIGSEGV), restarted: true, state: .backingOff, lastError: "killed by SIGSEGV"),
        PolicyCase(policy: .never, exit: .exited(0), restarted: false, state: .stopped, lastError: nil),
        PolicyCase(policy: .never, exit: .exited(3), restarted: false, state: .failed, lastError: "exit status 3"),
    ])
    func policy(_ c: PolicyCase) {
        let cron = worker("cron", restart: c.policy)
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        h.exit(cron, c.exit)
        #expect(h.status("cron") == .init(state: c.state, pid: nil, restarts: c.restarted ? 1 : 0, lastExit: c.exit,
                                          lastError: c.lastError))
        h.clock.advance(by: 3_600_000)
        #expect(h.spawner.attempts.count == (c.restarted ? 2 : 1))
    }

    @Test("backoff: each consecutive restart waits initial * factor^(n-1), at most the cap; a worker that ran for the cap starts over")
    func backoffDelays() {
        let cron = worker("cron", restart: .always) {
            $0.backoff.initial = 100
            $0.backoff.factor = 2
            $0.backoff.cap = 1000
            $0.intensity.maxRestarts = 100
        }
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        for (n, delay) in [100, 200, 400, 800, 1000, 1000].enumerated() {
            h.exit(cron, .exited(1))
            #expect(h.state("cron") == .backingOff)
            h.clock.advance(by: Millis(delay - 1))
            #expect(h.spawner.attempts.count == n + 1, "restart \(n + 1) waits \(delay) ms")
            h.clock.advance(by: 1)
            #expect(h.spawner.attempts.count == n + 2, "restart \(n + 1) after \(delay) ms")
        }
        // It runs for max(cap, 1 s): the next crash starts the backoff over.
        h.clock.advance(by: 1000)
        h.exit(cron, .exited(1))
        h.clock.advance(by: 99)
        #expect(h.spawner.attempts.count == 7)
        h.clock.advance(by: 1)
        #expect(h.spawner.attempts.count == 8)
        #expect(h.status("cron")?.restarts == 7)
    }

    @Test("more than intensity.restarts restarts within intensity.within: given up on (failed) and reported")
    func intensityLimit() {
        let cron = worker("cron") {
            $0.intensity.maxRestarts = 2
            $0.intensity.window = 10_000
        }
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        h.exit(cron, .exited(1))
        h.clock.advance(by: 200)
        h.exit(cron, .exited(1))
        h.clock.advance(by: 400)
        #expect(h.spawner.attempts.count == 3, "two restarts within the window")
        h.exit(cron, .exited(1))
        #expect(h.status("cron") == .init(state: .failed, pid: nil, restarts: 2, lastExit: .exited(1),
                                          lastError: "gave up: more than 2 restarts within 10.0 s (last: exit status 1)"))
        #expect(h.log.lines.contains { $0.level == .error && $0.message == "worker restarted too often; giving up" })
        h.clock.advance(by: 3_600_000)
        #expect(h.spawner.attempts.count == 3, "not restarted any more")
    }

    @Test("restarts further apart than intensity.within never reach the limit")
    func restartsOutsideTheWindow() {
        let cron = worker("cron") {
            $0.intensity.maxRestarts = 2
            $0.intensity.window = 10_000
        }
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        for round in 1...6 {
            h.exit(cron, .exited(1))
            #expect(h.state("cron") == .backingOff, "crash \(round)")
            h.clock.advance(by: 10_000)
        }
        #expect(h.spawner.attempts.count == 7)
        #expect(h.state("cron") == .running)
    }

    @Test("a command that cannot be started (ENOENT) is failed at once and never retried, until a restart request")
    func permanentSpawnFailure() {
        let todo = worker("todo", stores: ["todos"])
        let h = SupervisorHarness([todo])
        h.spawner.failures["/bin/todo"] = [.uv(UVError(code: -ENOENT, operation: "uv_spawn /bin/todo"))]
        h.supervisor.start()
        #expect(h.status("todo") == .init(state: .failed, pid: nil, restarts: 0, lastExit: nil,
                                          lastError: "cannot start /bin/todo: no such file or directory (ENOENT)"))
        #expect(h.log.contains("worker cannot be started; not retrying"))
        h.clock.advance(by: 3_600_000)
        #expect(h.spawner.attempts.count == 1)

        #expect(h.supervisor.restart(name: "todo"))
        #expect(h.spawner.attempts.count == 2)
        #expect(h.state("todo") == .starting)
        #expect(h.status("todo")?.lastError == nil)
    }

    @Test("a start that fails for a reason of the moment (EMFILE, ENOMEM) is retried after backoff whatever the policy, and is not a restart")
    func transientSpawnFailure() {
        let cron = worker("cron", restart: .never)
        let h = SupervisorHarness([cron])
        h.spawner.failures["/bin/cron"] = [.uv(UVError(code: -EMFILE, operation: "uv_spawn /bin/cron")),
                                           .uv(UVError(code: -ENOMEM, operation: "uv_spawn /bin/cron"))]
        h.supervisor.start()
        #expect(h.status("cron") == .init(
            state: .backingOff, pid: nil, restarts: 0, lastExit: nil,
            lastError: "cannot start /bin/cron for now: too many open files (EMFILE); retrying in 200 ms"))
        #expect(h.log.contains("worker start failed for now; retrying after backoff"))
        h.clock.advance(by: 200)
        #expect(h.spawner.attempts.count == 2)
        #expect(h.status("cron")?.lastError == "cannot start /bin/cron for now: not enough memory (ENOMEM); retrying in 400 ms")
        h.clock.advance(by: 399)
        #expect(h.spawner.attempts.count == 2)
        h.clock.advance(by: 1)
        #expect(h.spawner.attempts.count == 3)
        #expect(h.status("cron") == .init(state: .running, pid: 100, restarts: 0, lastExit: nil, lastError: nil))
    }
}

@Suite("Supervisor: stop and restart requests, reload, stopping everything")
struct SupervisorRequestTests {
    @Test("stop NAME: SIGTERM, stopped on exit and not restarted; SIGKILL when it outlives stop_timeout")
    func stopRequest() {
        let todo = worker("todo", stores: ["todos"], restart: .always) { $0.stopTimeout = 1000 }
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        h.register(todo)
        let process = h.spawner.latest("/bin/todo")!
        #expect(h.supervisor.stop(name: "todo"))
        #expect(process.signals == [SIGTERM])
        #expect(h.state("todo") == .stopping)
        h.clock.advance(by: 1000)
        #expect(process.signals == [SIGTERM, SIGKILL])
        h.exit(todo, .signalled(SIGKILL))
        #expect(h.state("todo") == .stopped)
        h.clock.advance(by: 3_600_000)
        #expect(h.spawner.attempts.count == 1, "held until restarted")
        #expect(!h.supervisor.stop(name: "nope"))
        #expect(!h.supervisor.restart(name: "nope"))
    }

    @Test("restart NAME: a stopped worker starts at once; a running one is stopped and started again, not counted as a restart")
    func restartRequest() {
        let todo = worker("todo", stores: ["todos"])
        let h = SupervisorHarness([todo])
        h.supervisor.start()
        h.register(todo)
        #expect(h.supervisor.stop(name: "todo"))
        h.exit(todo, .exited(0))
        #expect(h.supervisor.restart(name: "todo"))
        #expect(h.spawner.attempts.count == 2)
        h.register(todo)
        #expect(h.state("todo") == .running)

        let second = h.spawner.latest("/bin/todo")!
        #expect(h.supervisor.restart(name: "todo"))
        #expect(second.signals == [SIGTERM])
        #expect(h.state("todo") == .stopping)
        h.exit(todo, .exited(0))
        #expect(h.spawner.attempts.count == 3, "started again as soon as it stopped")
        #expect(h.status("todo")?.restarts == 0)
    }

    @Test("restart NAME forgets the restart history of a failed worker")
    func restartAFailedWorker() {
        let cron = worker("cron") { $0.intensity.maxRestarts = 0 }
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        h.exit(cron, .exited(1))
        #expect(h.state("cron") == .failed)
        #expect(h.supervisor.restart(name: "cron"))
        #expect(h.state("cron") == .running)
        #expect(h.status("cron")?.lastError == nil)
    }

    @Test("reload: an added worker starts, a removed one stops and is forgotten, a changed one restarts with its new spec, an unchanged one keeps running")
    func reloadApplied() {
        let a = worker("a", stores: ["a"]), b = worker("b", stores: ["b"]), c = worker("c", stores: ["c"])
        let h = SupervisorHarness([a, b, c])
        h.supervisor.start()
        for spec in [a, b, c] { h.register(spec) }
        let changedB = worker("b", stores: ["b"], arguments: ["--v2"])
        let d = worker("d", stores: ["d"])
        var fresh = SupervisorConfig(path: "/etc/test/fluxd.toml")
        fresh.workers = [a, changedB, d]

        h.supervisor.reload(to: fresh)

        #expect(h.spawner.latest("/bin/a")!.signals.isEmpty, "unchanged: untouched")
        #expect(h.spawner.latest("/bin/b")!.signals == [SIGTERM])
        #expect(h.spawner.latest("/bin/c")!.signals == [SIGTERM])
        #expect(h.state("d") == .starting)
        #expect(h.supervisor.workerNames == ["a", "b", "d", "c"], "the new file's order, workers on their way out last")
        let line = h.log.lines.first { $0.message == "config reloaded" }
        #expect(line?.metadata == ["added": "1", "removed": "1", "changed": "1"])

        h.exit(c, .exited(0))
        #expect(h.status("c") == nil, "forgotten once stopped")
        h.exit(b, .exited(0))
        #expect(h.spawner.latest("/bin/b")!.options.arguments == ["--v2", "--socket", SupervisorHarness.socketPath])
        #expect(h.state("b") == .starting)
        #expect(h.supervisor.config == fresh)
        #expect(h.clock.closedTimerCount == 1, "the removed worker's timer")
    }

    @Test("reload: a changed worker that is not running takes its new spec and starts")
    func reloadChangesAFailedWorker() {
        let cron = worker("cron") { $0.intensity.maxRestarts = 0 }
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        h.exit(cron, .exited(1))
        #expect(h.state("cron") == .failed)
        var fresh = SupervisorConfig(path: "/etc/test/fluxd.toml")
        fresh.workers = [worker("cron", arguments: ["--fixed"])]
        h.supervisor.reload(to: fresh)
        #expect(h.state("cron") == .running)
        #expect(h.spawner.latest("/bin/cron")!.options.arguments == ["--fixed", "--socket", SupervisorHarness.socketPath])
    }

    @Test("stopAll stops workers in reverse dependency order, each once nothing alive depends on its stores, then completes with every timer closed")
    func stopAllInReverseOrder() {
        let todo = worker("todo", stores: ["todos"])
        let stats = worker("stats", stores: ["stats"], after: ["todos"])
        let view = worker("view", after: ["stats"])
        let h = SupervisorHarness([todo, stats, view])
        h.supervisor.start()
        h.register(todo)
        h.register(stats)
        #expect(h.state("view") == .running)

        var completed = false
        h.supervisor.stopAll { completed = true }
        let signals = { (name: String) in h.spawner.latest("/bin/\(name)")!.signals }
        #expect(signals("view") == [SIGTERM])
        #expect(signals("stats").isEmpty && signals("todo").isEmpty)

        h.exit(view, .exited(0))
        #expect(signals("stats") == [SIGTERM])
        #expect(signals("todo").isEmpty)

        h.exit(stats, .exited(0))
        #expect(signals("todo") == [SIGTERM])
        #expect(!completed)

        // Nothing starts any more: not on a store change, not on a reload.
        var fresh = h.supervisor.config
        fresh.workers.append(worker("late"))
        h.supervisor.reload(to: fresh)
        #expect(h.spawner.processes("/bin/late").isEmpty)

        h.exit(todo, .exited(0))
        #expect(completed)
        #expect(h.supervisor.allStopped)
        #expect(["todo", "stats", "view"].map(h.state) == [.stopped, .stopped, .stopped])
        #expect(h.clock.allTimersClosed, "every timer closed")
        #expect(h.log.contains("every worker stopped"))
        #expect(h.spawner.attempts.count == 3)
    }

    @Test("stopAll with nothing running completes at once; a failed worker stays failed")
    func stopAllWithNothingRunning() {
        let cron = worker("cron", restart: .never)
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        h.exit(cron, .exited(1))
        var completed = false
        h.supervisor.stopAll { completed = true }
        #expect(completed)
        #expect(h.state("cron") == .failed)
        #expect(h.clock.allTimersClosed)
    }

    @Test("killAll SIGKILLs every worker and closes its output; the timers close once they all exited")
    func killAll() {
        let todo = worker("todo", stores: ["todos"])
        let cron = worker("cron")
        let h = SupervisorHarness([todo, cron])
        h.supervisor.start()
        h.supervisor.killAll()
        for name in ["todo", "cron"] {
            let process = h.spawner.latest("/bin/\(name)")!
            // SIGKILL first; the stop that follows (SIGTERM) reaches a process that is already dying.
            #expect(process.signals.first == SIGKILL)
            #expect(process.isClosed)
        }
        h.exit(todo, .signalled(SIGKILL))
        #expect(!h.clock.allTimersClosed)
        h.exit(cron, .signalled(SIGKILL))
        #expect(h.clock.allTimersClosed)
        #expect(h.spawner.attempts.count == 2, "nothing restarted")
    }
}

@Suite("Supervisor: host operations")
struct SupervisorHostOperationTests {
    @Test("workers lists every worker in start order with state, pid, restarts, uptime, last exit, stores and error")
    func workersReply() {
        let todo = worker("todo", stores: ["todos"])
        let cron = worker("cron", restart: .never)
        let h = SupervisorHarness([todo, cron])
        h.supervisor.start()
        h.register(todo)
        h.exit(cron, .signalled(SIGSEGV))
        h.clock.advance(by: 1500)
        guard case .reply(let frame) = h.supervisor.answer(.workers(id: "w1")) else {
            Issue.record("no reply")
            return
        }
        #expect(frame.text == #"{"op":"workers","id":"w1","workers":["#
            + #"{"name":"todo","state":"running","pid":100,"restarts":0,"uptime_ms":1500,"last_exit":null,"stores":["todos"]},"#
            + #"{"name":"cron","state":"failed","pid":null,"restarts":0,"uptime_ms":null,"last_exit":{"signal":"SIGSEGV"},"stores":[],"error":"killed by SIGSEGV"}"#
            + "]}")
    }

    @Test("a worker waiting for its after stores names the store and the state of the worker that provides it")
    func waitingWorkerSaysOnWhat() {
        let todo = worker("todo", stores: ["todos"], restart: .never)
        let stats = worker("stats", stores: ["stats"], after: ["todos"])
        let audit = worker("audit", after: ["nowhere"])
        let h = SupervisorHarness([todo, stats, audit])
        h.supervisor.start()
        h.exit(todo, .exited(1))
        guard case .reply(let frame) = h.supervisor.answer(.workers(id: "w")) else {
            Issue.record("no reply")
            return
        }
        #expect(frame.text.contains(#""name":"stats","state":"starting","pid":null,"restarts":0,"uptime_ms":null,"last_exit":null,"stores":["stats"],"error":"waiting for store \"todos\" to be up (worker todo is failed)"}"#), "\(frame.text)")
        #expect(frame.text.contains(#""error":"waiting for store \"nowhere\" to be up (no worker of the config provides it)"}"#), "\(frame.text)")
    }

    @Test("restart-worker and stop-worker answer with the worker; an unknown name is unknown-worker")
    func restartAndStopWorker() {
        let cron = worker("cron")
        let h = SupervisorHarness([cron])
        h.supervisor.start()
        guard case .reply(let stopped) = h.supervisor.answer(.stopWorker(id: "s", name: "cron")) else {
            Issue.record("no reply to stop-worker")
            return
        }
        #expect(stopped.text.hasPrefix(#"{"op":"worker","id":"s","worker":{"name":"cron","state":"stopping","pid":100,"#))
        guard case .error(let code, let message) = h.supervisor.answer(.restartWorker(id: "r", name: "nope")) else {
            Issue.record("no error for an unknown worker")
            return
        }
        #expect(code == .unknownWorker)
        #expect(message == #"no worker named "nope" in fluxd's running config"#)
    }
}

/// A fresh directory under /tmp.
func temporaryDirectory() throws -> String {
    var template = Array("/tmp/fluxdaemontests-XXXXXX".utf8CString)
    guard template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) != nil else {
        throw CocoaError(.fileWriteUnknown)
    }
    return String(decoding: template.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
