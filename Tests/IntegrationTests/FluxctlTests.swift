import FluxClient
import Foundation
import Glibc
import Testing

/// `fluxctl` as a real process against a real fluxd with the real example stores: exact human and `--json` output,
/// help text, error messages and exit codes.
@Suite("fluxctl")
struct FluxctlTests {
    /// Starts todo-store and stats-store and waits until stats has synced with todos (stats version 2), so the
    /// versions every test prints are deterministic. `todoPatches`: todo-store publishes every change as a patch
    /// (by default a state of at most 1 KiB goes whole, as stats-store's does).
    private func startTodoStores(_ bus: Bus, todoPatches: Bool = false) async throws -> (todo: StoreProcess, stats: StoreProcess) {
        let todo = try await bus.start("todo-store", environment: todoPatches ? ["FLUXBUS_WHOLE_STATE_LIMIT": "0"] : [:])
        let stats = try await bus.start("stats-store")
        let client = try await bus.connect("sync")
        let log = EventLog(client.subscribe(store: "stats", as: AnyCodable.self).snapshots.map(\.version))
        try await log.wait("stats synced with todos") { $0.contains(2) }
        log.cancel()
        await client.close()
        return (todo, stats)
    }

    @Test("fluxctl --help lists every subcommand and the exit codes; a subcommand's help shows its options; bad usage exits 64")
    func help() async throws {
        let root = try await fluxctl(["--help"], socket: nil)
        #expect(root.status == 0)
        #expect(root.stdout.contains("""
            Exit codes:
              0   success
              1   an action was rejected or unavailable, or no store handles it
              2   bad input: JSON argument, JSON pointer or --file line (shown where)
              3   no fluxd at the socket, the connection to it was lost, or it runs as an
                  unexpected uid (--server-uid, $FLUXBUS_SERVER_UID; 0 when run as root)
              4   timed out (--timeout; a stream without --count stops then with 0)
              5   fluxd refused a request (e.g. unknown store)
              64  bad usage (unknown option, missing argument)
            """), "\(root)")
        for sub in ["dispatch", "state", "watch", "query", "stores", "stats", "monitor", "ping"] {
            #expect(root.stdout.contains("\n  \(sub) "), "subcommand \(sub) missing from --help")
        }
        let dispatch = try await fluxctl(["dispatch", "--help"], socket: nil)
        #expect(dispatch.status == 0)
        #expect(dispatch.stdout.contains("USAGE: fluxctl dispatch [--socket <path>] [--server-uid <uid>] [--json] [--timeout <seconds>] [<type>] [<payload-json>] [--wait] [--count <count>] [--file <file>] [--window <window>] [--include-caused]"), "\(dispatch)")
        #expect(dispatch.stdout.contains("  --wait                  Wait for the settlement and print each store's result."))
        let monitor = try await fluxctl(["help", "monitor"], socket: nil)
        #expect(monitor.stdout.contains("--record <file>"))
        #expect(monitor.stdout.contains("--type <pattern>"))

        let usage = try await fluxctl(["dispatch", "todo/create", "--frobnicate"], socket: nil)
        #expect(usage.status == 64)
        #expect(usage.stderr.hasPrefix("fluxctl: Unknown option '--frobnicate'\nUsage: fluxctl dispatch "), "\(usage)")
        #expect(usage.stderr.hasSuffix("  See 'fluxctl dispatch --help' for more information.\n"), "\(usage)")
    }

    /// Runs fluxctl without a bus (commands that need none).
    private static func ctl(_ arguments: [String]) async throws -> FluxctlResult {
        let process = try FluxctlProcess(arguments, socket: nil)
        defer { process.cleanup() }
        return try await process.finish()
    }

    @Test("fluxctl completions bash|zsh|fish: scripts for each shell; bash's, sourced, completes subcommands and their options")
    func completions() async throws {
        // bash: the script parses, registers _fluxctl for fluxctl, and completes as a user would see it.
        let script = #"""
            set -e
            source <("$1" completions bash)
            complete -p fluxctl
            complete_line() { COMP_LINE="$1"; read -ra COMP_WORDS <<< "$1"; [[ "$1" == *" " ]] && COMP_WORDS+=("");
                COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMP_POINT=${#COMP_LINE}; COMPREPLY=();
                _fluxctl fluxctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"; echo "${COMPREPLY[*]}"; }
            complete_line "fluxctl jou"
            complete_line "fluxctl state --r"
            complete_line "fluxctl comp"
            """#
        let bash = try FluxctlProcess([], socket: nil, launcher: ["/bin/bash", "-c", script, "bash"])
        defer { bash.cleanup() }
        let result = try await bash.finish()
        #expect(result.status == 0, "\(result)")
        #expect(result.lines.first?.hasSuffix(" fluxctl") == true && result.lines.first?.contains("-F _fluxctl") == true, "\(result)")
        #expect(Array(result.lines.dropFirst()) == ["journal", "--raw", "completions"], "\(result)")
        // zsh and fish: their own formats, naming every subcommand.
        let zsh = try await Self.ctl(["completions", "zsh"])
        #expect(zsh.status == 0 && zsh.stdout.hasPrefix("#compdef fluxctl"), "\(zsh)")
        let fish = try await Self.ctl(["completions", "fish"])
        #expect(fish.status == 0 && fish.stdout.contains("complete -c 'fluxctl'"), "\(fish.stdout.prefix(300))")
        for sub in ["dispatch", "state", "watch", "monitor", "journal", "completions"] {
            #expect(zsh.stdout.contains(sub) && fish.stdout.contains(sub), "\(sub)")
        }
        let bad = try await Self.ctl(["completions", "powershell"])
        #expect(bad.status == 64 && bad.stderr.hasPrefix("fluxctl:"), "\(bad)")
    }

    @Test("fluxctl --version prints fluxctl 0.4.0; usage errors start with fluxctl: and exit 64; global options go before the subcommand too")
    func versionUsageAndGlobalOptions() async throws {
        let version = try await fluxctl(["--version"], socket: nil)
        #expect(version.status == 0)
        #expect(version.stdout == "fluxctl 0.4.0\n", "\(version)")
        #expect(version.stderr == "")

        // Every kind of usage error: unknown option, missing argument, a value that is not a number, a check of
        // fluxctl's own; each first line starts with "fluxctl: ", then the usage.
        let usageErrors: [([String], String)] = [
            (["stores", "--frobnicate"], "fluxctl: Unknown option '--frobnicate'\nUsage: fluxctl stores "),
            (["restart"], "fluxctl: Missing expected argument '<name>'\n"),
            (["ping", "--count", "many"], "fluxctl: The value 'many' is invalid for '--count <count>'"),
            (["ping", "--count", "0"], "fluxctl: --count must be at least 1\nUsage: fluxctl ping "),
            (["--timeout", "0", "stores"], "fluxctl: --timeout must be a positive number of seconds\n"),
            (["state", "todos", "--raw", "--json"], "fluxctl: give --raw or --json, not both\nUsage: fluxctl state "),
            (["frobnicate"], "fluxctl: unknown subcommand 'frobnicate' (subcommands: dispatch, state, "),
            (["--json", "--socket", "/x.sock", "stat"], "fluxctl: unknown subcommand 'stat'; did you mean 'state' or 'stats'?\nSee 'fluxctl --help'."),
            (["disptach", "a/b"], "fluxctl: unknown subcommand 'disptach'; did you mean 'dispatch'?\n"),
        ]
        for (arguments, prefix) in usageErrors {
            let result = try await fluxctl(arguments, socket: nil)
            #expect(result.status == 64, "\(arguments): \(result)")
            #expect(result.stdout == "", "\(arguments): \(result)")
            #expect(result.stderr.hasPrefix(prefix), "\(arguments): \(result)")
            #expect(!result.stderr.contains("Error:"), "\(arguments): \(result)")
        }

        // The root's help lists the global options (they are its options too) and --version.
        let help = try await fluxctl(["--help"], socket: nil)
        #expect(help.stdout.contains("USAGE: fluxctl [--socket <path>] [--server-uid <uid>] [--json] [--timeout <seconds>] <subcommand>"), "\(help)")
        #expect(help.stdout.contains("  --socket <path>"), "\(help)")
        #expect(help.stdout.contains("  --version"), "\(help)")

        // Without a fluxd: --socket before the subcommand is the socket fluxctl tries (exit 3 names it as --socket's).
        let dir = try TempDirectory()
        defer { dir.remove() }
        let path = dir.path + "/none.sock"
        let before = try await fluxctl(["--socket", path, "stores"], socket: dir.path + "/env.sock")
        #expect(before.status == 3)
        #expect(before.stderr.hasPrefix("fluxctl: no fluxd at \(path) (from --socket): no such socket\n"), "\(before)")

        try await withBus { bus in
            _ = try await startTodoStores(bus)
            #expect(try await bus.ctl("dispatch", "todo/create", #"{"title":"milk"}"#, "--wait").status == 0)
            let bogus = dir.path + "/bogus.sock"
            // FLUXBUS_SOCKET names nothing; the option before the subcommand wins, as it does after it.
            for arguments in [["--socket", bus.socketPath, "stores"], ["stores", "--socket", bus.socketPath]] {
                let stores = try await fluxctl(arguments, socket: bogus)
                #expect(stores.status == 0, "\(arguments): \(stores)")
                #expect(stores.lines.map { $0.split(separator: " ").first.map(String.init) ?? "" } == ["STORE", "stats", "todos"], "\(arguments): \(stores)")
            }
            // Several global options before, a subcommand's own after; --json before the subcommand.
            let json = try await fluxctl(["--json", "--timeout", "10", "--socket", bus.socketPath, "state", "todos", "--path", "/todos/0/title"], socket: bogus)
            #expect(json.stdout == #"{"store":"todos","version":2,"seq":1,"path":"/todos/0/title","value":"milk"}"# + "\n", "\(json)")
            // Given both before and after the subcommand, the last one counts.
            let twice = try await fluxctl(["--socket", bogus, "ping", "--socket", bus.socketPath], socket: nil)
            #expect(twice.status == 0, "\(twice)")
            #expect(twice.stdout.hasPrefix("pong from \(bus.socketPath) in "), "\(twice)")
        }
    }

    @Test("state --raw prints just the JSON value on one line (the whole state, --path, --seq); errors leave stdout empty")
    func stateRaw() async throws {
        try await withBus { bus in
            _ = try await startTodoStores(bus)
            #expect(try await bus.ctl("dispatch", "todo/create", #"{"title":"milk"}"#, "--wait").status == 0)
            #expect(try await bus.ctl("dispatch", "todo/create", #"{"title":"eggs \"free range\""}"#, "--wait").status == 0)

            let title = try await bus.ctl("state", "todos", "--path", "/todos/0/title", "--raw")
            #expect(title.status == 0)
            #expect(title.stdout == "\"milk\"\n", "\(title)")
            #expect(title.stderr == "")
            let quoted = try await bus.ctl("state", "todos", "--path", "/todos/1/title", "--raw")
            #expect(quoted.stdout == #""eggs \"free range\"""# + "\n", "\(quoted)")
            let number = try await bus.ctl("state", "todos", "--raw", "--path", "/nextID")
            #expect(number.stdout == "3\n", "\(number)")
            let todo = try await bus.ctl("state", "todos", "--path", "/todos/0", "--raw")
            #expect(todo.stdout == #"{"createdSeq":1,"done":false,"id":1,"title":"milk"}"# + "\n", "\(todo)")
            let whole = try await bus.ctl("state", "todos", "--raw")
            #expect(whole.stdout == #"{"nextID":3,"todos":[{"createdSeq":1,"done":false,"id":1,"title":"milk"},{"createdSeq":2,"done":false,"id":2,"title":"eggs \"free range\""}]}"# + "\n", "\(whole)")
            // Colours are never written with --raw, even when forced.
            let forced = try await bus.ctl("state", "todos", "--path", "/todos/0/title", "--raw", environment: ["CLICOLOR_FORCE": "1"])
            #expect(forced.stdout == "\"milk\"\n", "\(forced)")

            let missing = try await bus.ctl("state", "todos", "--path", "/todos/7", "--raw")
            #expect(missing.status == 2)
            #expect(missing.stdout == "")
            #expect(missing.stderr == "fluxctl: /todos/7 does not exist: /todos has 2 elements (in todos version 3)\n", "\(missing)")
            let unknown = try await bus.ctl("state", "nope", "--raw")
            #expect(unknown.status == 5)
            #expect(unknown.stdout == "")
            #expect(unknown.stderr.hasPrefix("fluxctl: unknown store \"nope\""), "\(unknown)")
            // An ephemeral fluxd keeps no past states: --seq with --raw fails on stderr, not with a half line.
            let past = try await bus.ctl("state", "todos", "--seq", "1", "--raw")
            #expect(past.status == 5, "\(past)")
            #expect(past.stdout == "")
            #expect(past.stderr.hasPrefix("fluxctl: "), "\(past)")
        }
    }

    @Test("ping --count N prints one summary line; --verbose each round trip before it; --json the summary (and each ping with --verbose)")
    func pingSummary() async throws {
        try await withBus { bus in
            let summaryLine = #"^4 pings to \#(NSRegularExpression.escapedPattern(for: bus.socketPath)): round trip min/avg/p50/p99/max = [0-9]+/[0-9]+/[0-9]+/[0-9]+/[0-9]+ µs$"#
            let quiet = try await bus.ctl("ping", "--count", "4")
            #expect(quiet.status == 0)
            #expect(quiet.lines.count == 1, "\(quiet)")
            #expect(quiet.lines[0].range(of: summaryLine, options: .regularExpression) != nil, "\(quiet)")

            let verbose = try await bus.ctl("ping", "--count", "4", "--verbose")
            #expect(verbose.status == 0)
            #expect(verbose.lines.count == 5, "\(verbose)")
            for (i, line) in verbose.lines.prefix(4).enumerated() {
                #expect(line.range(of: "^pong \(i + 1): [0-9]+ µs$", options: .regularExpression) != nil, "\(verbose)")
            }
            #expect(verbose.lines[4].range(of: summaryLine, options: .regularExpression) != nil, "\(verbose)")

            let json = try await bus.ctl("ping", "--count", "4", "--json")
            #expect(json.lines.count == 1, "\(json)")
            let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any], "\(json)")
            let summary = object.compactMapValues { ($0 as? NSNumber)?.doubleValue }
            #expect(Set(summary.keys) == ["count", "minUs", "avgUs", "medianUs", "p99Us", "maxUs"], "\(json)")
            #expect(summary["count"] == 4)
            let (lo, avg, hi) = (summary["minUs"] ?? -1, summary["avgUs"] ?? -1, summary["maxUs"] ?? -1)
            #expect(lo > 0 && lo <= avg && avg <= hi, "\(json)")
            let verboseJSON = try await bus.ctl("ping", "--count", "2", "--json", "--verbose")
            #expect(verboseJSON.lines.count == 3, "\(verboseJSON)")
            #expect(verboseJSON.lines[0].range(of: #"^\{"ping":1,"us":[0-9.]+\}$"#, options: .regularExpression) != nil, "\(verboseJSON)")
            #expect(verboseJSON.lines[2].hasPrefix(#"{"count":2,"minUs":"#), "\(verboseJSON)")

            // One ping (the default) is one line, as before.
            let one = try await bus.ctl("ping")
            #expect(one.lines.count == 1)
            #expect(one.lines.first?.range(of: #"^pong from .* in [0-9]+ µs$"#, options: .regularExpression) != nil, "\(one)")
        }
    }

    @Test("errors before fluxd is reached: no fluxd (exit 3, names the path and how to start one), bad JSON (exit 2, where), bad pointer")
    func errorsWithoutABus() async throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let path = dir.path + "/none.sock"
        let viaEnv = try await fluxctl(["stores"], socket: path)
        #expect(viaEnv.status == 3)
        #expect(viaEnv.stdout == "")
        #expect(viaEnv.stderr == """
            fluxctl: no fluxd at \(path) (from $FLUXBUS_SOCKET): no such socket
              start one with:  fluxd --socket \(path)
              or point fluxctl at a running one with --socket PATH or FLUXBUS_SOCKET=PATH

            """, "\(viaEnv)")
        let viaOption = try await fluxctl(["ping", "--socket", path], socket: nil)
        #expect(viaOption.status == 3)
        #expect(viaOption.stderr.hasPrefix("fluxctl: no fluxd at \(path) (from --socket): no such socket\n"), "\(viaOption)")

        let badJSON = try await fluxctl(["dispatch", "todo/create", #"{"title":"milk",}"#], socket: path)
        #expect(badJSON.status == 2)
        #expect(badJSON.stderr == """
            fluxctl: the payload is not valid JSON at column 17 (byte 16): expected a string key
              {"title":"milk",}
                              ^

            """, "\(badJSON)")
        let badQuery = try await fluxctl(["query", "comments", "{site:1}"], socket: path)
        #expect(badQuery.status == 2)
        #expect(badQuery.stderr.hasPrefix("fluxctl: the query is not valid JSON at column 2 (byte 1): expected a string key\n"), "\(badQuery)")
        // A directory is not a socket: fluxctl says so and shows where fluxd's socket file would go.
        let directory = try await fluxctl(["stores", "--socket", dir.path], socket: nil)
        #expect(directory.status == 3)
        #expect(directory.stderr == """
            fluxctl: no fluxd at \(dir.path) (from --socket): it is a directory, not a socket
              give the path of fluxd's socket file, not of its directory (e.g. \(dir.path)/fluxd.sock, where fluxd --socket \(dir.path)/fluxd.sock listens)
              or point fluxctl at a running one with --socket PATH or FLUXBUS_SOCKET=PATH

            """, "\(directory)")

        // README.md's Swift snippets are examples/readme's files, which the package builds; the view prints the
        // SDK's connect error (no backtrace) when no fluxd runs.
        let readme = try String(contentsOfFile: packageRoot + "/README.md", encoding: .utf8)
        for file in ["examples/readme/Store/main.swift", "examples/readme/View/main.swift"] {
            let code = try String(contentsOfFile: packageRoot + "/" + file, encoding: .utf8)
            #expect(readme.contains("```swift\n" + code + "```\n"), "README.md does not show \(file) as it is")
        }
        let view = Process()
        view.executableURL = URL(fileURLWithPath: try BuiltProducts.path(of: "readme-counter-view"))
        view.environment = ProcessInfo.processInfo.environment.merging(["FLUXBUS_SOCKET": path]) { $1 }
        let out = Pipe(), err = Pipe()
        view.standardOutput = out
        view.standardError = err
        try view.run()
        let viewOut = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let viewErr = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        view.waitUntilExit()
        #expect(view.terminationStatus == 0, "\(viewErr)")
        #expect(viewOut == """
            counter-view: no fluxd at \(path) (from $FLUXBUS_SOCKET): no such socket
              start one with:  fluxd --socket \(path)
              or connect to a running one: pass its socket path, or set FLUXBUS_SOCKET=PATH

            """, "\(viewOut)\(viewErr)")
        #expect(!viewErr.contains("Fatal error"), "\(viewErr)")

        let badPointer = try await fluxctl(["state", "todos", "--path", "todos/0"], socket: path)
        #expect(badPointer.status == 2)
        #expect(badPointer.stderr == "fluxctl: a JSON pointer is empty or starts with '/' (got \"todos/0\")\n", "\(badPointer)")
    }

    @Test("dispatch (--wait, --json, --count, rejection, no-handler), state (--path), stores, stats, ping, unknown store, timeout")
    func requestCommands() async throws {
        try await withBus { bus in
            let (todo, stats) = try await startTodoStores(bus)

            let created = try await bus.ctl("dispatch", "todo/create", #"{"title":"buy milk"}"#, "--wait")
            #expect(created.status == 0)
            #expect(created.stdout == """
                todo/create seq 1
                  stats  done  version 3
                  todos  done  version 2

                """, "\(created)")
            let rejected = try await bus.ctl("dispatch", "todo/toggle", #"{"id":99}"#, "--wait", "--json")
            #expect(rejected.status == 1)
            #expect(rejected.stdout == #"""
                {"type":"todo/toggle","seq":2,"ok":false,"results":[{"store":"stats","status":"done","version":4},{"store":"todos","status":"rejected","code":"todo/not-found","message":"no todo with id 99"}]}

                """#, "\(rejected)")
            let twice = try await bus.ctl("dispatch", "todo/create", #"{"title":"eggs"}"#, "--count", "2")
            #expect(twice.status == 0)
            #expect(twice.stdout == "dispatched todo/create 2 times\n", "\(twice)")
            let noHandler = try await bus.ctl("dispatch", "cart/add", "{}", "--wait")
            #expect(noHandler.status == 1)
            #expect(noHandler.stdout == "")
            #expect(noHandler.stderr == "fluxctl: no store handles \"cart/add\" (fluxd: no-handler)\n", "\(noHandler)")

            // The fire-and-forget dispatches were accepted before fluxctl exited (the ping barrier): the next
            // settled dispatch is seq 5 and the list holds three todos.
            let fourth = try await bus.ctl("dispatch", "todo/toggle", #"{"id":1}"#, "--wait", "--json")
            #expect(fourth.stdout.hasPrefix(#"{"type":"todo/toggle","seq":5,"ok":true,"#), "\(fourth)")

            let state = try await bus.ctl("state", "todos")
            #expect(state.status == 0)
            #expect(state.stdout == """
                todos version 5 (seq 5)
                {
                  "nextID": 4,
                  "todos": [
                    {
                      "createdSeq": 1,
                      "done": true,
                      "id": 1,
                      "title": "buy milk"
                    },
                    {
                      "createdSeq": 3,
                      "done": false,
                      "id": 2,
                      "title": "eggs"
                    },
                    {
                      "createdSeq": 4,
                      "done": false,
                      "id": 3,
                      "title": "eggs"
                    }
                  ]
                }

                """, "\(state)")
            let title = try await bus.ctl("state", "todos", "--path", "/todos/1/title", "--json")
            #expect(title.stdout == #"{"store":"todos","version":5,"seq":5,"path":"/todos/1/title","value":"eggs"}"# + "\n", "\(title)")
            let missing = try await bus.ctl("state", "todos", "--path", "/todos/7")
            #expect(missing.status == 2)
            #expect(missing.stderr == "fluxctl: /todos/7 does not exist: /todos has 3 elements (in todos version 5)\n", "\(missing)")
            let unknown = try await bus.ctl("state", "nope")
            #expect(unknown.status == 5)
            #expect(unknown.stderr == "fluxctl: unknown store \"nope\": fluxd has no snapshot of it (known stores: stats, todos)\n", "\(unknown)")

            let stores = try await bus.ctl("stores")
            #expect(stores.status == 0)
            let uid = String(getuid())
            let rows = stores.lines.map { $0.split(separator: " ").map(String.init) }
            #expect(rows == [
                ["STORE", "STATUS", "VERSION", "HANDLES", "WAITFOR", "SUBS", "QUEUED", "INFLIGHT", "QUERIES", "PID", "UID", "OWNER"],
                ["stats", "up", "7", "todo/*", "todos", "0", "0", "0", "0", String(stats.pid), uid, "stats-store"],
                ["todos", "up", "5", "todo/*", "-", "1", "0", "0", "0", String(todo.pid), uid, "todo-store"],
            ], "\(stores)")
            // Aligned: every cell starts where its header does.
            let header = stores.lines[0]
            for line in stores.lines.dropFirst() {
                for column in ["STATUS", "VERSION", "HANDLES", "PID", "OWNER"] {
                    let at = header.range(of: column)!.lowerBound.utf16Offset(in: header)
                    let index = line.index(line.startIndex, offsetBy: at)
                    #expect(line[line.index(before: index)] == " " && line[index] != " ", "\(column) misaligned:\n\(stores.stdout)")
                }
            }
            let storesJSON = try await bus.ctl("stores", "--json")
            #expect(storesJSON.lines.count == 2)
            #expect(storesJSON.lines[1] == #"{"name":"todos","status":"up","handles":["todo/*"],"waitFor":[],"version":5,"seq":5,"subscribers":1,"queued":0,"inflight":0,"queries":0,"owner":{"peer":\#(try ownerPeer(storesJSON.lines[1])),"name":"todo-store","pid":\#(todo.pid),"uid":\#(uid)}}"#, "\(storesJSON)")

            let statsJSON = try await bus.ctl("stats", "--json")
            let object = try #require(JSONSerialization.jsonObject(with: Data(statsJSON.stdout.utf8)) as? [String: Any], "\(statsJSON)")
            #expect(object["seq"] as? Int == 5)
            #expect((object["peers"] as? [String: Int])?["store"] == 2)
            let counters = try #require(object["counters"] as? [String: Any])
            #expect(counters["actions"] as? Int == 5)
            #expect((counters["errors"] as? [String: Int])?["no-handler"] == 1)
            #expect((object["queues"] as? [[String: Any]])?.map { $0["store"] as? String } == ["stats", "todos"])
            let statsText = try await bus.ctl("stats")
            #expect(statsText.lines.first == "fluxd at \(bus.socketPath), last seq 5")
            #expect(statsText.lines.contains("actions      5"), "\(statsText)")
            #expect(statsText.lines.contains("errors       no-handler 1, unknown-store 1"), "\(statsText)")
            #expect(statsText.lines.contains("queues       stats 0+0, todos 0+0  (queued+inflight)"), "\(statsText)")

            let ping = try await bus.ctl("ping", "--count", "5", "--json")
            #expect(ping.status == 0)
            #expect(ping.stdout.range(of: #"^\{"count":5,"minUs":[0-9.]+,"avgUs":[0-9.]+,"medianUs":[0-9.]+,"p99Us":[0-9.]+,"maxUs":[0-9.]+\}\n$"#, options: .regularExpression) != nil, "\(ping)")
            let pingText = try await bus.ctl("ping", "--count", "3")
            #expect(pingText.lines.count == 1, "\(pingText)")
            #expect(pingText.lines.first?.hasPrefix("3 pings to \(bus.socketPath): round trip min/avg/p50/p99/max = ") == true, "\(pingText)")

            // A timeout: nothing more happens to todos, so waiting for 5 more snapshots times out (exit 4).
            let timedOut = try await bus.ctl("watch", "todos", "--count", "5", "--timeout", "0.5")
            #expect(timedOut.status == 4)
            #expect(timedOut.stderr == "fluxctl: timed out after 0.5 s watching todos\n", "\(timedOut)")
            // Without --count, --timeout is how long to watch: the stream stops with exit 0.
            let watched = try await bus.ctl("watch", "todos", "--timeout", "0.5")
            #expect(watched.status == 0, "\(watched)")
            #expect(watched.stderr.isEmpty, "\(watched)")
            let statsWatch = try await bus.ctl("stats", "--watch", "--interval", "0.2", "--timeout", "1", "--json")
            #expect(statsWatch.status == 0, "\(statsWatch)")
            #expect(statsWatch.lines.count >= 2, "\(statsWatch)")
            // One dispatch without --wait: fluxd's `accepted` (ack, SPEC §8.3) gives its seq at once.
            let one = try await bus.ctl("dispatch", "todo/create", #"{"title":"tea"}"#)
            #expect(one.status == 0 && one.stdout == "todo/create seq 6\n", "\(one)")
            let oneJSON = try await bus.ctl("dispatch", "todo/create", #"{"title":"tea"}"#, "--json")
            #expect(oneJSON.stdout == #"{"type":"todo/create","seq":7}"# + "\n", "\(oneJSON)")
            let oneRefused = try await bus.ctl("dispatch", "cart/add", "{}")
            #expect(oneRefused.status == 1 && oneRefused.stderr == "fluxctl: no store handles \"cart/add\" (fluxd: no-handler)\n", "\(oneRefused)")
        }
    }

    private func ownerPeer(_ line: String) throws -> Int {
        let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
        return try #require((object?["owner"] as? [String: Any])?["peer"] as? Int)
    }

    @Test("forget: a store that is up is refused (exit 5, store-is-up); once down it is forgotten (its queued action given up), then unknown; nothing routes to it")
    func forgetStores() async throws {
        // (A queue timeout far past the test's length: the queued action must still be queued when `forget` comes;
        // under AddressSanitizer, with the whole suite on 2 cores, two fluxctl runs once took more than the 5 s
        // default and the action had been given up already.)
        try await withBus(["--queue-timeout", "600000"]) { bus in
            let todo = try await bus.start("todo-store")
            let up = try await bus.ctl("forget", "todos")
            #expect(up.status == 5 && up.stdout.isEmpty, "\(up)")
            #expect(up.stderr.contains("cannot forget todos: store \"todos\" is up"), "\(up)")
            todo.send(signal: SIGTERM)
            #expect(await todo.waitForExit(timeout: .seconds(20)) == 0)
            let client = try await bus.connect("forget-check")
            let deadline = ContinuousClock.now + .seconds(20)
            while try await client.info().stores.first(where: { $0.name == "todos" })?.status != "down" {
                guard ContinuousClock.now < deadline else { Issue.record("todos never went down"); return }
                try await Task.sleep(for: .milliseconds(20))
            }
            let queued = try await bus.ctl("dispatch", "todo/create", #"{"title":"never"}"#)
            #expect(queued.status == 0, "\(queued)")
            let forgot = try await bus.ctl("forget", "todos", "--json")
            #expect(forgot.status == 0 && forgot.stdout == #"{"store":"todos","gaveUp":1}"# + "\n", "\(forgot)")
            #expect(try await client.info().stores.contains { $0.name == "todos" } == false)
            let again = try await bus.ctl("forget", "todos", "nope")
            #expect(again.status == 5, "\(again)")
            #expect(again.stderr.contains("cannot forget todos: no store \"todos\" was registered"), "\(again)")
            #expect(again.stderr.contains("cannot forget nope:"), "\(again)")
            let noHandler = try await bus.ctl("dispatch", "todo/create", "{}", "--wait")
            #expect(noHandler.status == 1 && noHandler.stderr.contains("no-handler"), "\(noHandler)")
            let bad = try await bus.ctl("forget", "no spaces")
            #expect(bad.status == 64, "\(bad)")
            await client.close()
        }
    }

    @Test("watch takes several stores and patterns: each store's changes, stores that register later and match included")
    func watchSeveralStoresAndPatterns() async throws {
        try await withBus { bus in
            _ = try await startTodoStores(bus)
            let both = try FluxctlProcess(["watch", "todos", "stats", "--json"], socket: bus.socketPath)
            defer { both.cleanup() }
            let pattern = try FluxctlProcess(["watch", "todo*", "st*", "--json"], socket: bus.socketPath)
            defer { pattern.cleanup() }
            for p in [both, pattern] {
                try await p.wait("both retained states") { $0.contains(#""store":"todos","version""#) && $0.contains(#""store":"stats","version""#) }
            }
            _ = try await bus.ctl("dispatch", "todo/create", #"{"title":"milk"}"#, "--wait")
            for p in [both, pattern] {
                try await p.wait("a change in each") { $0.contains(#""event":"diff","store":"todos""#) && $0.contains(#""event":"diff","store":"stats""#) }
            }
            // A store that registers later and matches a pattern is watched from then on.
            // (A second counting store, registered under another name.)
            _ = try await bus.start("stats-store", ["--name", "todo-archive"])
            try await pattern.wait("the later store's state") { $0.contains(#""store":"todo-archive""#) }
            _ = try await bus.ctl("dispatch", "todo/create", #"{"title":"eggs"}"#, "--wait")
            try await pattern.wait("its change") { $0.contains(#""event":"diff","store":"todo-archive""#) }
            #expect(!both.stdout.contains("todo-archive"))
        }
    }

    @Test("watch shows the retained state, then each change with its path, old -> new, version, seq and action type")
    func watchDiffs() async throws {
        try await withBus { bus in
            _ = try await startTodoStores(bus)
            _ = try await bus.ctl("dispatch", "todo/create", #"{"title":"milk"}"#, "--wait")
            let human = try FluxctlProcess(["watch", "todos", "--count", "4"], socket: bus.socketPath)
            defer { human.cleanup() }
            let json = try FluxctlProcess(["watch", "todos", "--count", "4", "--json"], socket: bus.socketPath)
            defer { json.cleanup() }
            let full = try FluxctlProcess(["watch", "todos", "--count", "2", "--full", "--json"], socket: bus.socketPath)
            defer { full.cleanup() }
            for p in [human, json, full] { try await p.wait("the retained snapshot") { $0.contains("version 2") || $0.contains(#""version":2"#) } }

            _ = try await bus.ctl("dispatch", "todo/create", #"{"title":"eggs"}"#, "--wait")
            _ = try await bus.ctl("dispatch", "todo/toggle", #"{"id":1}"#, "--wait")
            _ = try await bus.ctl("dispatch", "todo/delete", #"{"id":1}"#, "--wait")

            let h = try await human.finish()
            #expect(h.status == 0)
            #expect(h.stdout == """
                watching todos (up, version 2)
                todos version 2 (seq 1)
                  {
                    "nextID": 2,
                    "todos": [
                      {
                        "createdSeq": 1,
                        "done": false,
                        "id": 1,
                        "title": "milk"
                      }
                    ]
                  }
                todos version 3 (seq 2 todo/create)
                  ~ /nextID  2 -> 3
                  + /todos/1  {"createdSeq":2,"done":false,"id":2,"title":"eggs"}
                todos version 4 (seq 3 todo/toggle)
                  ~ /todos/0/done  false -> true
                todos version 5 (seq 4 todo/delete)
                  - /todos/0  {"createdSeq":1,"done":true,"id":1,"title":"milk"}

                """, "\(h)")
            let j = try await json.finish()
            #expect(j.status == 0)
            #expect(j.stdout == #"""
                {"event":"subscribed","store":"todos","status":"up","version":2}
                {"event":"snapshot","store":"todos","version":2,"seq":1,"state":{"nextID":2,"todos":[{"createdSeq":1,"done":false,"id":1,"title":"milk"}]}}
                {"event":"diff","store":"todos","version":3,"seq":2,"type":"todo/create","changes":[{"op":"replace","path":"/nextID","old":2,"value":3},{"op":"add","path":"/todos/1","value":{"createdSeq":2,"done":false,"id":2,"title":"eggs"}}]}
                {"event":"diff","store":"todos","version":4,"seq":3,"type":"todo/toggle","changes":[{"op":"replace","path":"/todos/0/done","old":false,"value":true}]}
                {"event":"diff","store":"todos","version":5,"seq":4,"type":"todo/delete","changes":[{"op":"remove","path":"/todos/0","old":{"createdSeq":1,"done":true,"id":1,"title":"milk"}}]}

                """#, "\(j)")
            let f = try await full.finish()
            #expect(f.lines.count == 3)
            #expect(f.lines.last == #"{"event":"snapshot","store":"todos","version":3,"seq":2,"type":"todo/create","state":{"nextID":3,"todos":[{"createdSeq":1,"done":false,"id":1,"title":"milk"},{"createdSeq":2,"done":false,"id":2,"title":"eggs"}]}}"#, "\(f)")
        }
    }

    @Test("query holds a query open and prints the store's snapshots; the query ends with fluxctl")
    func query() async throws {
        try await withBus { bus in
            _ = try await bus.start("comments-store", ["--latency-ms", "0"])
            let q = try FluxctlProcess(["query", "comments", #"{"site":1}"#, "--json"], socket: bus.socketPath)
            defer { q.cleanup() }
            try await q.wait("the comments of site 1") { $0.contains(#""activeSites":[1]"#) && $0.contains(#""comments":{"1":[{"#) }
            let lines = q.stdout.split(separator: "\n")
            #expect(lines.first?.hasPrefix(#"{"event":"subscribed","store":"comments","status":"up","version":"#) == true, "\(q.stdout)")
            #expect(lines.dropFirst().allSatisfy { $0.hasPrefix(#"{"event":"snapshot","store":"comments","version":"#) }, "\(q.stdout)")
            q.send(signal: SIGINT)
            _ = try await q.finish()
            // fluxctl is gone, so is its query: the store hears the active set is empty again.
            let watcher = try FluxctlProcess(["watch", "comments", "--json", "--full"], socket: bus.socketPath)
            defer { watcher.cleanup() }
            try await watcher.wait("the query released") { $0.contains(#""activeSites":[]"#) }

            let human = try await bus.ctl("query", "comments", #"{"site":2}"#, "--count", "1")
            #expect(human.status == 0)
            #expect(human.lines.first == #"query comments {"site":2} active"#, "\(human)")
            #expect(human.lines[1].hasPrefix("watching comments (up, version "), "\(human)")
            #expect(human.lines[2].hasPrefix("comments version "), "\(human)")
        }
    }

    @Test("monitor shows every event in one line each (human, --json, filters); --record then dispatch --file in a fresh bus reproduces the todos state")
    func monitorRecordReplay() async throws {
        let dir = try TempDirectory()
        defer { dir.remove() }
        let recording = dir.path + "/session.jsonl"
        let finalState: String = try await withBus { bus in
            // todo-store's changes as patches (fluxd's event kind delta), stats-store's small state whole (snapshot).
            _ = try await startTodoStores(bus, todoPatches: true)
            let all = try FluxctlProcess(["monitor", "--time", "none", "--record", recording], socket: bus.socketPath)
            defer { all.cleanup() }
            let json = try FluxctlProcess(["monitor", "--json", "--type", "todo/toggle"], socket: bus.socketPath)
            defer { json.cleanup() }
            let byStore = try FluxctlProcess(["monitor", "--time", "none", "--store", "stats", "--count", "3"], socket: bus.socketPath)
            defer { byStore.cleanup() }
            // Wait until fluxd counts the three monitors, so none misses the session.
            let client = try await bus.connect("probe")
            for _ in 0..<200 {
                if (try await client.info().peers?.monitor ?? 0) >= 3 { break }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(try await client.info().peers?.monitor == 3)
            await client.close()

            _ = try await bus.ctl("dispatch", "todo/create", #"{"title":"milk"}"#, "--wait")
            _ = try await bus.ctl("dispatch", "todo/create", #"{"title":"eggs"}"#, "--wait")
            _ = try await bus.ctl("dispatch", "todo/toggle", #"{"id":99}"#, "--wait")
            _ = try await bus.ctl("dispatch", "todo/toggle", #"{"id":2}"#, "--wait")
            _ = try await bus.ctl("dispatch", "todo/edit", #"{"id":1,"title":"oat milk"}"#, "--wait")
            try await all.wait("the last settlement") { $0.contains("settle     #5 ") }
            try await json.wait("the toggles") { $0.components(separatedBy: #""kind":"settle""#).count == 3 }

            let lines = all.stdout.split(separator: "\n").map(String.init)
            let actionLines = lines.filter { !$0.hasPrefix("connect") && !$0.hasPrefix("disconnect") }
            #expect(Array(actionLines.prefix(5)) == [
                #"dispatch   #1 todo/create from fluxctl(\#(try peer(in: actionLines[0]))) {"title":"milk"}"#,
                "delta      todos v2 #1 (patch, 136 bytes)",
                "snapshot   stats v3 #1 (62 bytes)",
                "settle     #1 stats done v3, todos done v2",
                #"dispatch   #2 todo/create from fluxctl(\#(try peer(in: actionLines[4]))) {"title":"eggs"}"#,
            ], "\(all.stdout)")
            #expect(actionLines.contains("settle     #3 stats done v5, todos rejected todo/not-found"), "\(all.stdout)")
            #expect(lines.contains { $0.hasPrefix("connect    fluxctl(") && $0.contains(" client pid ") }, "\(all.stdout)")
            #expect(lines.contains { $0.hasPrefix("disconnect fluxctl(") }, "\(all.stdout)")

            let events = try json.stdout.split(separator: "\n").map {
                try #require(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
            }
            #expect(events.map { "\($0["kind"]!) \($0["seq"] ?? "-")" } == [
                "dispatch 3", "snapshot 3", "settle 3", "dispatch 4", "delta 4", "snapshot 4", "settle 4",
            ], "\(json.stdout)")
            #expect(events[0]["type"] as? String == "todo/toggle")
            #expect(events[0]["t"] is Int)
            #expect((events[0]["payload"] as? [String: Int]) == ["id": 99])

            let stats = try await byStore.finish()
            #expect(stats.lines == [
                #"dispatch   #1 todo/create from fluxctl(\#(try peer(in: stats.lines[0]))) {"title":"milk"}"#,
                "snapshot   stats v3 #1 (62 bytes)",
                "settle     #1 stats done v3, todos done v2",
            ], "\(stats)")

            all.send(signal: SIGINT)
            _ = try await all.finish()
            return try await bus.ctl("state", "todos", "--json").stdout
        }
        let recorded = try String(contentsOfFile: recording, encoding: .utf8)
        #expect(recorded == #"""
            {"seq":1,"type":"todo/create","payload":{"title":"milk"}}
            {"seq":2,"type":"todo/create","payload":{"title":"eggs"}}
            {"seq":3,"type":"todo/toggle","payload":{"id":99}}
            {"seq":4,"type":"todo/toggle","payload":{"id":2}}
            {"seq":5,"type":"todo/edit","payload":{"id":1,"title":"oat milk"}}

            """#)

        try await withBus { fresh in
            _ = try await startTodoStores(fresh)
            let replay = try await fresh.ctl("dispatch", "--file", recording, "--window", "3")
            #expect(replay.status == 1, "the recorded session holds one rejected toggle")
            #expect(replay.lines.last == "replayed 5 actions from \(recording): 4 ok, 1 failed", "\(replay)")
            #expect(replay.lines.contains("todo/toggle seq 3 (line 3)"), "\(replay)")
            #expect(replay.lines.contains("  todos  rejected  todo/not-found: no todo with id 99"), "\(replay)")
            let state = try await fresh.ctl("state", "todos", "--json")
            #expect(state.stdout == finalState)
            #expect(state.stdout.contains(#""title":"oat milk""#))

            // The same recording from stdin, as JSON, on top: each line settles in order.
            let again = try await fresh.ctl("dispatch", "--file", "-", "--json", stdin: recorded)
            #expect(again.lines.map { $0.components(separatedBy: #","ok""#)[0] } == [
                #"{"line":1,"type":"todo/create","seq":6"#, #"{"line":2,"type":"todo/create","seq":7"#,
                #"{"line":3,"type":"todo/toggle","seq":8"#, #"{"line":4,"type":"todo/toggle","seq":9"#,
                #"{"line":5,"type":"todo/edit","seq":10"#,
            ], "\(again)")
            let bad = try await fresh.ctl("dispatch", "--file", "-", stdin: "{\"type\":\"todo/create\"}\n{\"type\":\"todo/create\",\"payload\":{\"title\" \"x\"}}\n")
            #expect(bad.status == 2)
            #expect(bad.stderr == """
                fluxctl: stdin line 2 is not valid JSON at column 42: expected ':'
                  {"type":"todo/create","payload":{"title" "x"}}
                  \(String(repeating: " ", count: 41))^

                """, "\(bad)")
            #expect(try await fresh.ctl("state", "todos", "--path", "/nextID").stdout.hasSuffix("\n5\n"), "nothing of a bad file is dispatched")
        }
    }

    @Test("typed host operations against fluxd with a worker: FluxClient.workers/stopWorker/restartWorker and fluxctl workers --json")
    func hostOperations() async throws {
        let config = """
            [workers.idle]
            command = "/bin/sh"
            args = ["-c", "exec sleep 600"]
            socket_arg = false
            """
        let host = try SupervisedFluxd(config: config)
        defer { host.cleanup() }
        let raw = try host.waitForWorkers("idle running") { $0.state("idle") == "running" }
        let client = try await FluxClient.connect(socketPath: host.socketPath, name: "host-ops")
        defer { client.abort() }
        let workers = try await client.workers()
        #expect(workers.map(\.name) == ["idle"])
        #expect(workers[0].state == .running)
        #expect(workers[0].pid.map(Int32.init) == raw.pid("idle"))
        #expect(workers[0].restarts == 0)
        #expect(workers[0].uptimeMilliseconds != nil)
        #expect(workers[0].stores == [])

        let listed = try await fluxctl(["workers", "--json"], socket: host.socketPath)
        #expect(listed.status == 0)
        // fluxctl's field names are camelCase (the wire's are uptime_ms and last_exit, SPEC §8.11), in fluxd's order.
        #expect(listed.stdout.range(of: #"^\{"name":"idle","state":"running","pid":\#(workers[0].pid ?? 0),"restarts":0,"uptimeMs":[0-9]+,"lastExit":null,"stores":\[\]\}\n$"#, options: .regularExpression) != nil, "\(listed)")
        #expect(!listed.stdout.contains("_"), "\(listed)")

        let stopped = try await client.stopWorker("idle")
        #expect(stopped.name == "idle")
        #expect([.stopping, .stopped].contains(stopped.state), "\(stopped.state)")
        try host.waitForWorkers("idle stopped") { $0.state("idle") == "stopped" }
        #expect(try await client.workers()[0].state == .stopped)
        // The stopped worker's last exit, as lastExit in --json and in the table's LAST EXIT column.
        let afterStop = try await fluxctl(["workers", "--json"], socket: host.socketPath)
        #expect(afterStop.stdout.contains(#","lastExit":{"#), "\(afterStop)")
        #expect(!afterStop.stdout.contains("_"), "\(afterStop)")
        let table = try await fluxctl(["workers"], socket: host.socketPath)
        let row = table.lines.dropFirst().first?.split(separator: " ").map(String.init) ?? []
        #expect(row.count >= 6 && row[0] == "idle" && row[1] == "stopped" && row[5] != "-", "\(table)")
        let restarted = try await client.restartWorker("idle")
        #expect([.starting, .running].contains(restarted.state), "\(restarted.state)")
        try host.waitForWorkers("idle running again") { $0.state("idle") == "running" }

        do {
            _ = try await client.restartWorker("nope")
            Issue.record("restarting an unknown worker should fail")
        } catch {
            #expect(error.code == .unknownWorker)
        }
        let unknown = try await fluxctl(["stop", "nope"], socket: host.socketPath)
        #expect(unknown.status == 5)
        #expect(unknown.stderr.contains("no worker named \"nope\""), "\(unknown)")
    }

    /// The peer id in `... from fluxctl(7) ...`.
    private func peer(in line: String) throws -> Int {
        let open = try #require(line.range(of: "fluxctl("))
        let rest = line[open.upperBound...]
        return try #require(Int(rest.prefix { $0.isNumber }))
    }
}

/// The package's root directory (this file is Tests/IntegrationTests/FluxctlTests.swift).
private let packageRoot: String = {
    var url = URL(fileURLWithPath: #filePath)
    for _ in 0..<3 { url.deleteLastPathComponent() }
    return url.path
}()

/// Any JSON (the tests only need snapshot versions).
struct AnyCodable: Decodable, Sendable {
    init(from decoder: any Decoder) throws {}
}
