import Foundation
import Glibc
import Testing

/// fluxd as a plugin host (`fluxd --config FILE`): real fluxd, real example stores as workers, shell scripts as
/// crashing and hung workers.
@Suite("fluxd supervises store workers", .onDedicatedThreads)
struct SupervisorTests {
    static let examples = """
        [fluxd]
        drain_timeout = 5

        [workers.todo]
        command = "todo-store"
        stores = ["todos"]
        backoff = { initial = 1, factor = 2, max = 5 }

        [workers.stats]
        command = "stats-store"
        stores = ["stats"]
        after = ["todos"]

        [workers.comments]
        command = "comments-store"
        args = ["--latency-ms", "10"]
        stores = ["comments"]

        """

    @Test("starts workers in dependency order; SIGTERM stops them in reverse order, exit 0, no child and no socket left")
    func dependencyOrderAndCleanShutdown() throws {
        try withSupervisedFluxd(config: Self.examples) { host in
            let workers = try host.waitForWorkers("every worker running") { w in
                ["todo", "stats", "comments"].allSatisfy { w.state($0) == "running" }
            }
            let pids = ["todo", "stats", "comments"].compactMap { workers.pid($0) }
            #expect(pids.count == 3)
            #expect(pids.allSatisfy(processExists))
            for name in ["todo", "stats", "comments"] { #expect(workers.restarts(name) == 0) }

            let log = host.fluxd.stderr
            // stats (after = ["todos"]) is started only once todos is registered.
            let todosUp = try #require(log.range(of: "store \"todos\" registered"))
            let statsStarted = try #require(log.range(of: #"worker started[^\n]* worker=stats\b"#, options: .regularExpression))
            #expect(todosUp.lowerBound < statsStarted.lowerBound, "stats started before todos was up:\n\(log)")
            // Each worker's output lands in fluxd's log with its name (fluxd may read a worker's "ready" line after
            // it saw the worker register: wait for it).
            try host.waitForLog("todo| todo-store ready")
            try host.waitForLog("stats| stats-store ready")

            let status = host.fluxd.stop(timeout: .seconds(20))
            #expect(status == 0)
            #expect(host.fluxd.exitedNormally)
            let finalLog = host.fluxd.stderr
            // Reverse dependency order: stats (which needs todos) stops before todo.
            let statsStopped = try #require(finalLog.range(of: #"worker stopped[^\n]* worker=stats\b"#, options: .regularExpression))
            let todoStopped = try #require(finalLog.range(of: #"worker stopped[^\n]* worker=todo\b"#, options: .regularExpression))
            #expect(statsStopped.lowerBound < todoStopped.lowerBound)
            #expect(!pids.contains(where: processExists), "a worker outlived fluxd")
            #expect(access(host.socketPath, F_OK) != 0, "the socket file was left behind")
        }
    }

    @Test("todo worker SIGKILLed mid-stream: restarted, store-up, resumes from its snapshot; actions sent while down applied once, in order")
    func crashedWorkerIsRestartedAndNothingIsLost() throws {
        try withSupervisedFluxd(config: Self.examples, arguments: ["--queue-timeout", "20000"]) { host in
            let before = try host.waitForWorkers("todo and stats running") { $0.state("todo") == "running" && $0.state("stats") == "running" }
            let oldPID = try #require(before.pid("todo"))
            let view = try RawPeer.ready(host.socketPath, name: "view")
            try view.subscribe("todos")

            func dispatch(_ title: String) throws {
                try view.send(frame: #"{"op":"dispatch","id":"\#(title)","type":"todo/create","payload":{"title":"\#(title)"},"settle":true}"#)
            }
            // A stream: some answered before the crash, some in flight at the kill, more while the store is down.
            for title in ["a", "b", "c"] { try dispatch(title) }
            _ = try view.read(until: "settled c") { $0.op == "settled" && $0.string("id") == "c" }
            for title in ["d", "e"] { try dispatch(title) }
            kill(oldPID, SIGKILL)
            // d (and even e) may have been answered before the kill landed: their settlements can come before
            // store-down, and count like the ones after it.
            var settled: [String] = []
            var sawUp = false
            func note(_ m: Message) {
                if m.op == "store-up" { sawUp = true }
                if m.op == "settled", let id = m.string("id") {
                    if ["f", "g", "h"].contains(id) { #expect(sawUp, "\(id) settled before store-up") }
                    settled.append(id)
                    #expect(m.results["todos"]?["status"] as? String == "done", "\(m)")
                }
            }
            let (early, down) = try view.read(until: "store-down") { $0.op == "store-down" }
            #expect(down.string("store") == "todos")
            early.forEach(note)
            for title in ["f", "g", "h"] { try dispatch(title) }

            while settled.count < 5 {
                note(try view.message(timeout: .seconds(20)))
            }
            #expect(settled.sorted() == ["d", "e", "f", "g", "h"])
            #expect(sawUp)
            #expect(settled.filter { ["f", "g", "h"].contains($0) } == ["f", "g", "h"])
            try view.send(frame: #"{"op":"get","id":"g","store":"todos"}"#)
            let got = try view.read(until: "got") { $0.op == "got" }.match
            // Resumed from the snapshot (a, b, c kept) and every action applied exactly once, in seq order.
            #expect(try got.state(as: TodoList.self).todos.map(\.title) == ["a", "b", "c", "d", "e", "f", "g", "h"])

            let after = try host.waitForWorkers("todo running again") { $0.state("todo") == "running" }
            #expect(after.restarts("todo") == 1)
            #expect(after.pid("todo") != oldPID)
            #expect((after["todo"]?["last_exit"] as? [String: Any])?["signal"] as? String == "SIGKILL")
            #expect(host.fluxd.stderr.contains("resumed"))
        }
    }

    @Test("stopping a worker that is a shell script stops the processes it started too (its whole process group)")
    func stoppingAShellWorkerLeavesNoGrandchild() throws {
        let config = """
            [workers.shell]
            command = "/bin/sh"
            args = ["-c", "sleep 300 & echo grandchild $!; wait"]
            socket_arg = false
            stores = ["shell-store"]
            start_timeout = 60
            stop_timeout = 5
            """
        try withSupervisedFluxd(config: config) { host in
            let log = try host.waitForLog("shell| grandchild ")
            let line = try #require(log.components(separatedBy: "\n").first { $0.contains("shell| grandchild ") })
            let pid = try #require(Int32(line.components(separatedBy: "shell| grandchild ").last!
                .prefix { $0.isNumber }))
            #expect(processExists(pid), "the worker's own child is running")
            let status = host.fluxd.stop(timeout: .seconds(20))
            #expect(status == 0)
            // The grandchild may take a moment to be reaped by init after the group's SIGTERM: wait with a deadline.
            let deadline = ContinuousClock.now + .seconds(10)
            while processExists(pid) && ContinuousClock.now < deadline { usleep(10_000) }
            #expect(!processExists(pid), "the shell worker's child outlived fluxd")
            if processExists(pid) { kill(pid, SIGKILL) }
        }
    }

    @Test("a worker that keeps crashing is restarted with backoff until the intensity limit, then given up on and reported")
    func intensityLimitGivesUp() throws {
        let config = """
            [workers.crasher]
            command = "/bin/sh"
            args = ["-c", "echo crashing; exit 3"]
            socket_arg = false
            stores = ["crash-store"]
            restart = "always"
            backoff = { initial = 0.05, factor = 2, max = 0.2 }
            intensity = { restarts = 3, within = 60 }
            """
        try withSupervisedFluxd(config: config) { host in
            let workers = try host.waitForWorkers("crasher failed") { $0.state("crasher") == "failed" }
            #expect(workers.restarts("crasher") == 3)
            #expect(workers["crasher"]?["pid"] is NSNull)
            #expect((workers["crasher"]?["last_exit"] as? [String: Any])?["code"] as? Int == 3)
            #expect((workers["crasher"]?["error"] as? String)?.contains("gave up") == true)
            try host.waitForLog("giving up")
            // 1 start + 3 restarts, each printing one line (a line may be logged just after its exit was seen).
            func starts() -> Int { host.fluxd.stderr.components(separatedBy: "crasher| crashing").count - 1 }
            let deadline = ContinuousClock.now + .seconds(10)
            while starts() < 4 && ContinuousClock.now < deadline { usleep(20_000) }
            #expect(starts() == 4, "\(host.fluxd.stderr)")
            // Given up means no more starts: the state stays failed after a round trip.
            #expect(try host.workers().state("crasher") == "failed")
        }
    }

    @Test("a hung worker that never registers is killed after its start timeout (SIGKILL when it ignores SIGTERM)")
    func hungWorkerIsKilled() throws {
        let config = """
            [workers.hung]
            command = "./hung.sh"
            args = []
            stores = ["never"]
            restart = "never"
            start_timeout = 2
            stop_timeout = 0.3
            """
        // The start timeout leaves the shell (started through fluxd-exec, under ASan on a loaded machine) ample time
        // to install its trap: a SIGTERM that arrives before it would end the script and prove nothing.
        let script = "#!/bin/sh\ntrap '' TERM\necho hanging\nwhile :; do sleep 0.05; done\n"
        // Relative commands are taken from the config file's directory.
        try withSupervisedFluxd(config: config, files: ["hung.sh": script]) { host in
            let workers = try host.waitForWorkers("hung failed") { $0.state("hung") == "failed" }
            #expect((workers["hung"]?["last_exit"] as? [String: Any])?["signal"] as? String == "SIGKILL")
            #expect((workers["hung"]?["error"] as? String)?.contains("did not register never") == true)
            let log = host.fluxd.stderr
            #expect(log.contains("did not register its stores within the start timeout"))
            #expect(log.contains("did not exit within the stop timeout; sending SIGKILL"))
            #expect(log.contains("hung| hanging"), "the script's trap was in place before the timeout")
        }
    }

    @Test("a worker whose command does not exist is reported failed once, not retried")
    func missingCommandIsNotRetried() throws {
        let config = """
            [workers.ghost]
            command = "/nonexistent/fluxbus-worker"
            stores = ["ghost"]
            restart = "always"
            backoff = { initial = 0.01, factor = 1, max = 0.01 }
            """
        try withSupervisedFluxd(config: config) { host in
            let workers = try host.waitForWorkers("ghost failed") { $0.state("ghost") == "failed" }
            #expect(workers.restarts("ghost") == 0)
            #expect((workers["ghost"]?["error"] as? String)?.contains("no such file or directory") == true)
            // Reported once, not retried: another round trip later it is still the one report.
            _ = try host.workers()
            #expect(host.fluxd.stderr.components(separatedBy: "worker cannot be started").count - 1 == 1)
        }
    }

    @Test("SIGHUP reloads the config: added worker started, removed stopped, changed restarted, unchanged kept")
    func reload() throws {
        let first = """
            [workers.todo]
            command = "todo-store"
            stores = ["todos"]

            [workers.comments]
            command = "comments-store"
            stores = ["comments"]

            [workers.idle]
            command = "/bin/sh"
            args = ["-c", "exec sleep 600"]
            socket_arg = false
            """
        let second = """
            [workers.todo]
            command = "todo-store"
            stores = ["todos"]
            stop_timeout = 3

            [workers.stats]
            command = "stats-store"
            stores = ["stats"]
            after = ["todos"]

            [workers.idle]
            command = "/bin/sh"
            args = ["-c", "exec sleep 600"]
            socket_arg = false
            """
        try withSupervisedFluxd(config: first) { host in
            let before = try host.waitForWorkers("first config running") { w in
                ["todo", "comments", "idle"].allSatisfy { w.state($0) == "running" }
            }
            let comments = try #require(before.pid("comments"))
            try host.rewrite(config: second)
            host.fluxd.send(signal: SIGHUP)
            let after = try host.waitForWorkers("second config running") { w in
                w["comments"] == nil && w.state("stats") == "running" && w.state("todo") == "running"
                    && w.pid("todo") != before.pid("todo")
            }
            #expect(after.pid("idle") == before.pid("idle"), "an unchanged worker was restarted")
            #expect(after.restarts("idle") == 0)
            #expect(!processExists(comments), "the removed worker still runs")
            #expect(host.fluxd.stderr.contains("config reloaded"))

            // A broken file on SIGHUP changes nothing.
            try host.rewrite(config: "[workers.todo\n")
            host.fluxd.send(signal: SIGHUP)
            try host.waitForLog("config reload failed")
            let unchanged = try host.workers()
            #expect(unchanged.pid("todo") == after.pid("todo"))
            #expect(unchanged.state("stats") == "running")
        }
    }

    @Test("fluxctl workers --json lists every worker, one per line")
    func fluxctlWorkers() throws {
        try withSupervisedFluxd(config: Self.examples) { host in
            try host.waitForWorkers("comments running") { $0.state("comments") == "running" }
            let list = try runFluxctl(["workers", "--json", "--socket", host.socketPath])
            #expect(list.status == 0)
            #expect(list.stdout.split(separator: "\n").count == 3)
            #expect(list.stdout.contains(#""name":"comments""#))
        }
    }

    @Test("fluxctl stop NAME stops the worker's process; restart NAME runs it again")
    func fluxctlStopAndRestart() throws {
        try withSupervisedFluxd(config: Self.examples) { host in
            let before = try host.waitForWorkers("comments running") { $0.state("comments") == "running" }
            let stopped = try runFluxctl(["stop", "comments", "--socket", host.socketPath])
            #expect(stopped.status == 0, "\(stopped.stderr)")
            try host.waitForWorkers("comments stopped") { $0.state("comments") == "stopped" }
            #expect(!processExists(try #require(before.pid("comments"))))

            let restarted = try runFluxctl(["restart", "comments", "--socket", host.socketPath])
            #expect(restarted.status == 0, "\(restarted.stderr)")
            try host.waitForWorkers("comments running again") { $0.state("comments") == "running" }
        }
    }

    @Test("fluxctl restart of a worker the config does not name exits 5 and says so")
    func fluxctlRestartUnknownWorker() throws {
        try withSupervisedFluxd(config: Self.examples) { host in
            let unknown = try runFluxctl(["restart", "nope", "--socket", host.socketPath])
            #expect(unknown.status == 5)
            #expect(unknown.stderr.contains("no worker named \"nope\""))
        }
    }

    @Test("SIGTERM drains: a new dispatch gets shutting-down, the in-flight action still settles, then fluxd exits 0")
    func gracefulStopLetsInFlightActionsSettle() throws {
        let config = """
            [workers.idle]
            command = "/bin/sh"
            args = ["-c", "exec sleep 600"]
            socket_arg = false
            """
        try withSupervisedFluxd(config: config) { host in
            let idle = try host.waitForWorkers("idle running") { $0.state("idle") == "running" }
            let store = try RawPeer.ready(host.socketPath, role: "store", name: "slow-store")
            try store.register("slow", handles: ["slow/*"])
            let view = try RawPeer.ready(host.socketPath, name: "view")
            try view.send(frame: #"{"op":"dispatch","id":"one","type":"slow/go","settle":true}"#)
            let action = try store.read(until: "action") { $0.op == "action" }.match
            let seq = try #require(action.int("seq"))

            host.fluxd.send(signal: SIGTERM)
            try host.waitForLog("draining")
            try view.send(frame: #"{"op":"dispatch","id":"two","type":"slow/go","settle":true}"#)
            let refused = try view.read(until: "error for two") { $0.op == "error" && $0.string("ref") == "two" }.match
            #expect(refused.string("code") == "shutting-down")

            try store.send(frame: #"{"op":"done","store":"slow","seq":\#(seq),"state":{"n":1}}"#)
            let settled = try view.read(until: "settled one") { $0.op == "settled" && $0.string("id") == "one" }.match
            // Done, not shutting-down: fluxd waited for the in-flight action before it shut down.
            #expect(settled.results["slow"]?["status"] as? String == "done")
            #expect(host.fluxd.waitForExit(timeout: .seconds(20)) == 0)
            #expect(!processExists(try #require(idle.pid("idle"))))
            #expect(access(host.socketPath, F_OK) != 0)
        }
    }

    @Test("bad configs: fluxd names the file, line or key and the problem, and does not start", arguments: [
        ("[workers.todo]\ncommand = \"todo-store\"\nstores = [\"todos\"\n", ":3", "not valid TOML"),
        ("[workers.todo]\ncommand = \"todo-store\"\nrestart = \"sometimes\"\n", ":3: workers.todo.restart: must be one of always, on-failure, never", ""),
        ("[workers.todo]\ncomand = \"todo-store\"\n", ":2: workers.todo.comand: unknown key", ""),
        ("[workers.todo]\nargs = [\"x\"]\n", ":1: workers.todo: missing key 'command'", ""),
        ("[workers.a]\ncommand = \"x\"\nstores = [\"a\"]\nafter = [\"b\"]\n[workers.b]\ncommand = \"y\"\nstores = [\"b\"]\nafter = [\"a\"]\n", "dependency cycle among workers a, b", ""),
        ("[workers.a]\ncommand = \"x\"\nafter = [\"nowhere\"]\n", ":3: workers.a.after: store 'nowhere' is not provided by any worker", ""),
        ("[workers.a]\ncommand = \"x\"\nstart_timeout = \"10s\"\n", ":3: workers.a.start_timeout: must be a number, not a string", ""),
        ("[fluxd]\nqueue_limit = -1\n", ":2: fluxd.queue_limit: must not be negative (got -1)", ""),
    ])
    func badConfig(config: String, expected: String, alsoExpected: String) throws {
        let host = try SupervisedFluxd(config: config, waitForReady: false)
        defer { host.cleanup() }
        let status = host.fluxd.waitForExit(timeout: .seconds(20))
        #expect(status == 1)
        let stderr = host.fluxd.stderr
        #expect(stderr.contains("fluxd: error: bad config: \(host.configPath)"), "\(stderr)")
        #expect(stderr.contains(expected), "\(stderr)")
        if !alsoExpected.isEmpty { #expect(stderr.contains(alsoExpected), "\(stderr)") }
        #expect(access(host.socketPath, F_OK) != 0, "fluxd listened despite a bad config")
    }
}

/// Runs the built fluxctl and returns its exit status, stdout and stderr.
func runFluxctl(_ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
    try runBuilt("fluxctl", arguments)
}

/// Runs a built product (fluxd, fluxctl, ...) to its exit: its status, stdout and stderr.
func runBuilt(_ product: String, _ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: product))
    process.arguments = arguments
    let out = Pipe(), err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    try process.run()
    let stdout = out.fileHandleForReading.readDataToEndOfFile()
    let stderr = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
}

/// fluxd's journal across a crash of fluxd itself, with supervised workers (issue 15).
@Suite("a durable fluxd with workers", .onDedicatedThreads)
struct DurableSupervisorTests {
    static let config = """
        [workers.todo]
        command = "todo-store"
        stores = ["todos"]

        [workers.lingerer]
        command = "./linger.sh"
        stores = ["never"]
        restart = "never"
        start_timeout = 60
        stop_timeout = 0.3

        """
    /// A worker that would outlive fluxd: it ignores SIGTERM and SIGHUP and never looks at its connection.
    static let linger = "#!/bin/sh\ntrap '' TERM HUP\nwhile :; do sleep 0.05; done\n"

    @Test("fluxd SIGKILLed: its worker dies with it (PR_SET_PDEATHSIG via fluxd-exec); the next fluxd on the same data directory starts it again and the todo is still there")
    func workersDieWithFluxdAndResumeFromTheJournal() throws {
        let data = try TempDirectory(prefix: "fluxdata")
        defer { data.remove() }
        var oldPID: Int32 = 0
        try withSupervisedFluxd(config: Self.config, files: ["linger.sh": Self.linger],
                                arguments: ["--data-dir", data.path]) { host in
            let workers = try host.waitForWorkers("todo running, lingerer started") {
                $0.state("todo") == "running" && $0.pid("lingerer") != nil
            }
            oldPID = try #require(workers.pid("todo"))
            let lingerer = try #require(workers.pid("lingerer"))
            let view = try RawPeer.ready(host.socketPath, name: "view")
            try view.send(frame: #"{"op":"dispatch","id":"milk","type":"todo/create","payload":{"title":"milk"},"settle":true}"#)
            let settled = try view.expect("settled")
            #expect(settled.results["todos"]?["status"] as? String == "done", "\(settled)")
            host.fluxd.send(signal: SIGKILL)
            _ = host.fluxd.waitForExit(timeout: .seconds(10))
            let deadline = ContinuousClock.now + .seconds(10)
            while (processExists(oldPID) || processExists(lingerer)) && ContinuousClock.now < deadline { usleep(10_000) }
            #expect(!processExists(oldPID), "the todo worker outlived the fluxd that was SIGKILLed")
            #expect(!processExists(lingerer), "a worker that ignores its connection outlived the fluxd that was SIGKILLed")
        }
        try withSupervisedFluxd(config: Self.config, files: ["linger.sh": Self.linger],
                                arguments: ["--data-dir", data.path]) { host in
            let log = try host.waitForLog("journal: read")
            #expect(log.contains("1 stores"), "\(log)")
            let peer = try RawPeer.ready(host.socketPath, name: "get")
            // The retained snapshot is there before the worker registers again, and after.
            try peer.send(frame: #"{"op":"get","store":"todos"}"#)
            let got = try peer.expect("got")
            #expect(got.text.contains("milk"), "\(got)")
            let workers = try host.waitForWorkers("todo running again") { $0.state("todo") == "running" }
            #expect(workers.pid("todo") != oldPID)
            try peer.send(frame: #"{"op":"dispatch","id":"eggs","type":"todo/create","payload":{"title":"eggs"},"settle":true}"#)
            #expect(try peer.expect("settled").results["todos"]?["status"] as? String == "done")
            try peer.send(frame: #"{"op":"get","store":"todos"}"#)
            let after = try peer.expect("got")
            #expect(after.text.contains("milk") && after.text.contains("eggs"), "\(after)")
        }
    }
}
