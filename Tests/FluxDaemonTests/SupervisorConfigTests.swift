@testable import FluxDaemon
import FluxRouter
import Foundation
import Testing

/// Parses `text` as the config file `/etc/fluxbus/fluxd.toml`.
private func parse(_ text: String) throws(ConfigError) -> SupervisorConfig {
    try SupervisorConfig.parse(text: text, path: "/etc/fluxbus/fluxd.toml", executableDirectory: nil)
}

/// The message a config is refused with (nil when it parses).
private func refusal(_ text: String) -> String? {
    do {
        _ = try parse(text)
        return nil
    } catch {
        return error.description
    }
}

/// A config refused with a message, and why the case is here.
struct BadConfig: Sendable, CustomTestStringConvertible {
    var what: String
    var text: String
    var message: String
    var testDescription: String { what }
}

@Suite("SupervisorConfig: what a config file means")
struct SupervisorConfigTests {
    @Test("every key of a worker is read; relative paths are taken from the config file's directory")
    func everyKey() throws {
        let config = try parse("""
            [fluxd]
            drain_timeout = 2.5

            [workers.todo]
            command = "bin/todo-store"
            args = ["--verbose"]
            cwd = "data"
            env = { TODO_MODE = "test" }
            stores = ["todos", "app/todos"]
            restart = "always"
            backoff = { initial = 0.1, factor = 3, max = 5 }
            intensity = { restarts = 4, within = 30 }
            start_timeout = 2
            stop_timeout = 0.5
            socket_arg = false
            """)
        #expect(config.path == "/etc/fluxbus/fluxd.toml")
        #expect(config.drainTimeout == 2500)
        var expected = WorkerSpec(name: "todo", command: "bin/todo-store", executable: "/etc/fluxbus/bin/todo-store")
        expected.arguments = ["--verbose"]
        expected.workingDirectory = "/etc/fluxbus/data"
        expected.environment = ["TODO_MODE": "test"]
        expected.stores = ["todos", "app/todos"]
        expected.restart = .always
        expected.backoff.initial = 100
        expected.backoff.factor = 3
        expected.backoff.cap = 5000
        expected.intensity.maxRestarts = 4
        expected.intensity.window = 30_000
        expected.startTimeout = 2000
        expected.stopTimeout = 500
        expected.socketArgument = false
        #expect(config.workers == [expected])
    }

    @Test("admin_users and admin_groups: names resolved to ids, numeric ids as they are")
    func admins() throws {
        let config = try parse("""
            [fluxd]
            admin_users = ["root", 1234]
            admin_groups = ["root", 50]

            [workers.todo]
            command = "/bin/todo-store"
            """)
        #expect(config.adminUIDs == [0, 1234])
        #expect(config.adminGIDs == [0, 50])
    }

    @Test("defaults: on-failure, backoff 0.2 s x2 up to 10 s, 5 restarts in 60 s, 10 s to register, 5 s to stop, --socket passed")
    func defaults() throws {
        let config = try parse("[workers.a]\ncommand = \"/usr/bin/a\"\n")
        #expect(config.drainTimeout == 5000)
        #expect(config.workers == [WorkerSpec(name: "a", command: "/usr/bin/a", executable: "/usr/bin/a")])
        let spec = config.workers[0]
        #expect(spec.restart == .onFailure)
        #expect(spec.backoff == Backoff())
        #expect([spec.backoff.delay(attempt: 1), spec.backoff.delay(attempt: 2), spec.backoff.delay(attempt: 7)] == [200, 400, 10_000])
        #expect(spec.intensity.maxRestarts == 5 && spec.intensity.window == 60_000)
        #expect(spec.startTimeout == 10_000 && spec.stopTimeout == 5_000 && spec.socketArgument)
    }

    @Test("a bare command name is looked for next to fluxd first, else left to PATH")
    func commandResolution() throws {
        let text = "[workers.a]\ncommand = \"sh\"\n"
        let found = try SupervisorConfig.parse(text: text, path: "/x/fluxd.toml", executableDirectory: "/bin")
        #expect(found.workers[0].executable == "/bin/sh")
        let notFound = try SupervisorConfig.parse(text: text, path: "/x/fluxd.toml", executableDirectory: "/nonexistent")
        #expect(notFound.workers[0].executable == "sh")
    }

    @Test("workers come in dependency order (providers first, otherwise by name)")
    func dependencyOrder() throws {
        let config = try parse("""
            [workers.view]
            command = "/bin/view"
            after = ["stats"]

            [workers.stats]
            command = "/bin/stats"
            stores = ["stats"]
            after = ["todos"]

            [workers.todo]
            command = "/bin/todo"
            stores = ["todos"]

            [workers.alpha]
            command = "/bin/alpha"
            """)
        #expect(config.workers.map(\.name) == ["alpha", "todo", "stats", "view"])
    }

    @Test("store names follow the protocol's rule (SPEC §4.1): 'app/todos', 'a.b:c-d_e' are valid")
    func protocolStoreNames() throws {
        let config = try parse("""
            [workers.a]
            command = "/bin/a"
            stores = ["app/todos", "a.b:c-d_e", "\(String(repeating: "s", count: 128))"]
            """)
        #expect(config.workers[0].stores.count == 3)
    }

    @Test("a file that cannot be read is named with the reason")
    func unreadableFile() {
        do {
            _ = try SupervisorConfig.load(path: "/nonexistent/fluxd.toml", executableDirectory: nil)
            Issue.record("a missing file was read")
        } catch {
            #expect(error.file == "/nonexistent/fluxd.toml")
            #expect(error.line == nil && error.key == nil)
            // The reason is Foundation's text (it varies between Foundation versions).
            #expect(error.problem.hasPrefix("cannot read the file: "))
            #expect(error.description.hasPrefix("/nonexistent/fluxd.toml: cannot read the file: "))
        }
    }

    static let badConfigs: [BadConfig] = [
        BadConfig(what: "not TOML", text: "[workers.a\ncommand = \"/bin/a\"\n",
                  message: #"/etc/fluxbus/fluxd.toml:1:11: not valid TOML: Error while parsing table header: expected ']', saw '\n'"#),
        BadConfig(what: "unknown top-level key", text: "colour = \"blue\"\n[workers.a]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:1: colour: unknown key (known here: fluxd, workers)"),
        BadConfig(what: "unknown key under [fluxd]", text: "[fluxd]\ndrain = 1\n[workers.a]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:2: fluxd.drain: unknown key (known here: drain_timeout, admin_users, admin_groups, " + DaemonSettings.keys.keys.sorted().joined(separator: ", ") + ")"),
        BadConfig(what: "a mistyped key under [fluxd]", text: "[fluxd]\nqueue_limt = 5\n[workers.a]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:2: fluxd.queue_limt: unknown key; did you mean queue_limit?"),
        BadConfig(what: "an admin user that does not exist", text: "[fluxd]\nadmin_users = [\"no-such-user-fluxbus\"]\n[workers.a]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:2: fluxd.admin_users: no user named \"no-such-user-fluxbus\" on this machine"),
        BadConfig(what: "admin groups not an array", text: "[fluxd]\nadmin_groups = \"wheel\"\n[workers.a]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:2: fluxd.admin_groups: must be an array of group names or ids, not a string"),
        BadConfig(what: "unknown worker key", text: "[workers.a]\ncommand = \"/bin/a\"\nrestarts = 3\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.restarts: unknown key; did you mean restart?"),
        BadConfig(what: "unknown backoff key", text: "[workers.a]\ncommand = \"/bin/a\"\nbackoff = { initial = 1, cap = 2 }\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.backoff.cap: unknown key (known here: initial, factor, max)"),
        BadConfig(what: "bad worker name", text: "[workers.\"todo store\"]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:1: workers.todo store: a worker name is 1 to 64 letters, digits, '-', '_' or '.'"),
        BadConfig(what: "worker name too long", text: "[workers.\(String(repeating: "w", count: 65))]\ncommand = \"/bin/a\"\n",
                  message: "/etc/fluxbus/fluxd.toml:1: workers.\(String(repeating: "w", count: 65)): a worker name is 1 to 64 letters, digits, '-', '_' or '.'"),
        BadConfig(what: "a worker that is not a table", text: "workers = { a = 1 }\n",
                  message: "/etc/fluxbus/fluxd.toml:1: workers.a: must be a table, not an integer"),
        BadConfig(what: "bad store name", text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"to dos\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.stores: 'to dos' is not a valid store name (1-128 bytes of A-Z a-z 0-9 . _ : / -, SPEC §4.1)"),
        BadConfig(what: "store name too long", text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"\(String(repeating: "s", count: 129))\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.stores: '\(String(repeating: "s", count: 129))' is not a valid store name (1-128 bytes of A-Z a-z 0-9 . _ : / -, SPEC §4.1)"),
        BadConfig(what: "a store listed twice", text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"s\", \"s\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.stores: lists a store twice"),
        BadConfig(what: "stores not strings", text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"s\", 2]\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.stores: must be an array of strings; element 2 is an integer"),
        BadConfig(what: "missing command", text: "[workers.a]\nargs = []\n",
                  message: "/etc/fluxbus/fluxd.toml:1: workers.a: missing key 'command' (the executable to run)"),
        BadConfig(what: "empty command", text: "[workers.a]\ncommand = \"\"\n",
                  message: "/etc/fluxbus/fluxd.toml:2: workers.a.command: must not be empty"),
        BadConfig(what: "command not a string", text: "[workers.a]\ncommand = [\"/bin/a\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:2: workers.a.command: must be a string, not an array"),
        BadConfig(what: "bad restart policy", text: "[workers.a]\ncommand = \"/bin/a\"\nrestart = \"sometimes\"\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.restart: must be one of always, on-failure, never (got \"sometimes\")"),
        BadConfig(what: "bad environment variable name", text: "[workers.a]\ncommand = \"/bin/a\"\nenv = { \"A=B\" = \"x\" }\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.env.A=B: not a valid variable name"),
        BadConfig(what: "negative duration", text: "[workers.a]\ncommand = \"/bin/a\"\nstop_timeout = -1\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.stop_timeout: must be a number of seconds between 0 and one year (got -1.0)"),
        BadConfig(what: "duration not a number", text: "[workers.a]\ncommand = \"/bin/a\"\nstart_timeout = \"10s\"\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.start_timeout: must be a number, not a string"),
        BadConfig(what: "zero start timeout", text: "[workers.a]\ncommand = \"/bin/a\"\nstart_timeout = 0\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.start_timeout: must be above 0"),
        BadConfig(what: "backoff factor out of range", text: "[workers.a]\ncommand = \"/bin/a\"\nbackoff = { factor = 0.5 }\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.backoff.factor: must be between 1 and 100"),
        BadConfig(what: "backoff max below initial", text: "[workers.a]\ncommand = \"/bin/a\"\nbackoff = { initial = 5, max = 1 }\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.backoff.max: must not be below backoff.initial"),
        BadConfig(what: "intensity restarts not a whole number", text: "[workers.a]\ncommand = \"/bin/a\"\nintensity = { restarts = 2.5 }\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.intensity.restarts: must be a whole number of restarts, 0 or more"),
        BadConfig(what: "intensity window of 0", text: "[workers.a]\ncommand = \"/bin/a\"\nintensity = { within = 0 }\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.intensity.within: must be above 0"),
        BadConfig(what: "socket_arg not a boolean", text: "[workers.a]\ncommand = \"/bin/a\"\nsocket_arg = \"no\"\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.socket_arg: must be true or false"),
        BadConfig(what: "a store provided twice",
                  text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"s\"]\n[workers.b]\ncommand = \"/bin/b\"\nstores = [\"s\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:6: workers.b.stores: store 's' is already provided by worker 'a'"),
        BadConfig(what: "after a store nobody provides", text: "[workers.a]\ncommand = \"/bin/a\"\nafter = [\"todos\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:3: workers.a.after: store 'todos' is not provided by any worker (list it under some worker's stores)"),
        BadConfig(what: "after its own store", text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"s\"]\nafter = [\"s\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:4: workers.a.after: the worker waits for its own store 's'"),
        BadConfig(what: "a dependency cycle",
                  text: "[workers.a]\ncommand = \"/bin/a\"\nstores = [\"sa\"]\nafter = [\"sb\"]\n[workers.b]\ncommand = \"/bin/b\"\nstores = [\"sb\"]\nafter = [\"sa\"]\n",
                  message: "/etc/fluxbus/fluxd.toml:4: workers.a.after: dependency cycle among workers a, b"),
    ]

    @Test("a bad config is refused with the file, line, key and problem", arguments: badConfigs)
    func badConfig(_ bad: BadConfig) {
        #expect(refusal(bad.text) == bad.message)
    }
}

/// Reading the file (issue 25: `reload` reads it on fluxd's loop): only a regular file of at most 1 MiB of UTF-8,
/// each refusal saying what the file is.
@Suite("SupervisorConfig: reading the file")
struct ConfigFileReadTests {
    /// A new empty directory (the test removes it).
    private func temporaryDirectory() throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("fluxcfg-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    private func problem(_ path: String) -> String? {
        do {
            _ = try SupervisorConfig.load(path: path, executableDirectory: nil)
            return nil
        } catch {
            return error.problem
        }
    }

    @Test("a FIFO, a device and a directory are refused for what they are, without reading (a FIFO with no writer does not hang)")
    func notRegular() throws {
        let dir = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let fifo = dir + "/fifo.toml"
        #expect(mkfifo(fifo, 0o600) == 0)
        #expect(problem(fifo) == "not a regular file (it is a FIFO): a config file must be a regular file")
        #expect(problem("/dev/zero") == "not a regular file (it is a device): a config file must be a regular file")
        #expect(problem(dir) == "not a regular file (it is a directory): a config file must be a regular file")
        #expect(problem(dir + "/missing.toml")?.hasPrefix("cannot read the file: No such file") == true)
    }

    @Test("more than 1 MiB is refused with its size; bytes that are not UTF-8 are refused; 1 MiB of comments is read")
    func sizeAndEncoding() throws {
        let dir = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let big = dir + "/big.toml"
        try Data(repeating: UInt8(ascii: "#"), count: SupervisorConfig.maxBytes + 1).write(to: URL(fileURLWithPath: big))
        #expect(problem(big) == "the file has 1048577 bytes; a config file may have at most 1048576 (1 MiB)")
        let fits = dir + "/fits.toml"
        try Data(repeating: UInt8(ascii: "#"), count: SupervisorConfig.maxBytes - 1).write(to: URL(fileURLWithPath: fits))
        var withNewline = try Data(contentsOf: URL(fileURLWithPath: fits))
        withNewline.append(UInt8(ascii: "\n"))
        try withNewline.write(to: URL(fileURLWithPath: fits))
        #expect(problem(fits) == nil)
        let latin = dir + "/latin1.toml"
        try Data([0x23, 0xE9, 0x0A]).write(to: URL(fileURLWithPath: latin))
        #expect(problem(latin) == "not UTF-8 text")
    }
}
