import FluxClient
import FluxCore
import Foundation
import Glibc
import Testing

/// fluxd's config file as the one place for its settings (issue 17 item 2, docs/configuration.md): `[fluxd]` keys
/// for every option, the command line over the file, `--check-config`, and `reload` all or nothing.
@Suite("fluxd's config file: [fluxd] settings, --check-config, reload")
struct ConfigFileTests {
    /// fluxd's refusal of a `reload` (code and message), or nil when it reloaded.
    private func refusal(_ client: FluxClient) async -> (code: ErrorCode, message: String)? {
        do {
            _ = try await client.reload()
            return nil
        } catch {
            if case .server(let e) = error { return (e.code ?? .unknownOp, e.message) }
            return (.unknownOp, "not a refusal from fluxd: \(error)")
        }
    }

    /// Runs `fluxd ARGUMENTS` to its exit: (status, stdout, stderr).
    private func runFluxd(_ arguments: [String]) throws -> (Int32, String, String) {
        try runBuilt("fluxd", arguments)
    }

    @Test("turn_micros (docs/limits.md) is an option of fluxd and a key of the file", .onDedicatedThreads)
    func turnMicrosIsAnOption() throws {
        let (status, help, _) = try runFluxd(["--help"])
        #expect(status == 0)
        #expect(help.contains("--turn-micros <µs>"))
        let dir = try TempDirectory(prefix: "fluxturn")
        defer { dir.remove() }
        try "[fluxd]\nturn_micros = 100\n".write(toFile: dir.path + "/turn.toml", atomically: true, encoding: .utf8)
        let (checked, out, err) = try runFluxd(["--check-config", dir.path + "/turn.toml"])
        #expect(checked == 0, "\(out)\(err)")
    }

    @Test("--max-frame is at most 32 MiB with a journal (one record holds a frame's payload or state); --ephemeral takes more", .onDedicatedThreads)
    func maxFrameFitsAJournalRecord() throws {
        let dir = try TempDirectory(prefix: "fluxframe")
        defer { dir.remove() }
        for (frame, ephemeral, ok) in [(33_554_432, false, true), (33_554_433, false, false), (100_000_000, true, true)] {
            let config = dir.path + "/frame-\(frame)-\(ephemeral).toml"
            try "[fluxd]\nmax_frame = \(frame)\nmax_backlog = 200000000\nephemeral = \(ephemeral)\n"
                .write(toFile: config, atomically: true, encoding: .utf8)
            let (status, out, err) = try runFluxd(["--check-config", config])
            #expect((status == 0) == ok, "\(frame) \(ephemeral): \(out)\(err)")
            if !ok { #expect(err.contains("--max-frame must be at most 33554432 bytes (32 MiB) with a journal"), "\(err)") }
        }
    }

    @Test("--check-config: ok with a summary, or exit 1 naming the file, line and key (or the option) of the problem; nothing starts", .onDedicatedThreads)
    func checkConfig() throws {
        let dir = try TempDirectory(prefix: "fluxcfg")
        defer { dir.remove() }
        let good = dir.path + "/good.toml"
        try """
            [fluxd]
            socket = "bus.sock"
            queue_limit = 10
            log_format = "json"
            drain_timeout = 5

            [workers.todo]
            command = "todo-store"
            stores = ["todos"]
            """.write(toFile: good, atomically: true, encoding: .utf8)
        let (status, stdout, _) = try runFluxd(["--check-config", good])
        #expect(status == 0)
        #expect(stdout == "\(good): ok: 1 worker (todo), 4 [fluxd] settings (drain_timeout, log_format, queue_limit, socket)\n")
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/bus.sock"), "nothing listened")

        let typo = dir.path + "/typo.toml"
        try "[fluxd]\nqueue_limt = 10\n".write(toFile: typo, atomically: true, encoding: .utf8)
        let (typoStatus, _, typoError) = try runFluxd(["--check-config", typo])
        #expect(typoStatus == 1)
        #expect(typoError.contains("\(typo):2: fluxd.queue_limt: unknown key; did you mean queue_limit?"), "\(typoError)")

        let wrongType = dir.path + "/type.toml"
        try "[fluxd]\nmax_frame = \"big\"\n".write(toFile: wrongType, atomically: true, encoding: .utf8)
        let (typeStatus, _, typeError) = try runFluxd(["--check-config", wrongType])
        #expect(typeStatus == 1)
        #expect(typeError.contains("\(wrongType):2: fluxd.max_frame: must be a non-negative integer"), "\(typeError)")

        // What a start needs: every command that is not there, in one pass, each with its line.
        let missing = dir.path + "/missing.toml"
        try """
            [workers.a]
            command = "no-such-command-fluxbus"
            stores = ["s"]

            [workers.b]
            command = "./not-here"
            after = ["s"]
            """.write(toFile: missing, atomically: true, encoding: .utf8)
        let (missingStatus, _, missingError) = try runFluxd(["--check-config", missing])
        #expect(missingStatus == 1)
        #expect(missingError.contains("\(missing):2: workers.a.command: \"no-such-command-fluxbus\" is not an executable file (looked for: next to fluxd or in PATH"), "\(missingError)")
        #expect(missingError.contains("\(missing):6: workers.b.command: \"./not-here\" is not an executable file (looked for: \(dir.path)/./not-here)"), "\(missingError)")

        // Every problem in one pass, in line order: two broken lines, unknown keys, a bad value, a missing command.
        let many = dir.path + "/many.toml"
        try """
            [fluxd]
            drain_timout = 5
            log_level = 7

            [workers.todo]
            command = "todo-store"
            restrat = "always"

            [workers.stats]
            args = ["x"]

            [workers.view
            command = "x"
            stores = = ["v"]
            """.write(toFile: many, atomically: true, encoding: .utf8)
        let (manyStatus, _, manyError) = try runFluxd(["--check-config", many])
        #expect(manyStatus == 1)
        let problems = manyError.split(separator: "\n").filter { $0.hasPrefix("fluxd: error: bad config: ") }
        #expect(problems.map { $0.split(separator: ":")[4] } == ["2", "3", "7", "9", "12", "14"], "\(manyError)")
        #expect(manyError.contains("\(many):2: fluxd.drain_timout: unknown key; did you mean drain_timeout?"), "\(manyError)")
        #expect(manyError.contains("\(many):3: fluxd.log_level: must be a string"), "\(manyError)")
        #expect(manyError.contains("\(many):7: workers.todo.restrat: unknown key; did you mean restart?"), "\(manyError)")
        #expect(manyError.contains("\(many):9: workers.stats: missing key 'command'"), "\(manyError)")
        #expect(manyError.contains("\(many):12:14: not valid TOML"), "\(manyError)")
        #expect(!manyError.contains("workers.stats.command"), "the keys after a broken header are not read as the table before it: \(manyError)")
        #expect(manyError.hasSuffix("fluxd: 6 problems in \(many)\n"), "\(manyError)")

        let badValue = dir.path + "/value.toml"
        try "[fluxd]\ndurability = \"sometimes\"\n".write(toFile: badValue, atomically: true, encoding: .utf8)
        let (valueStatus, _, valueError) = try runFluxd(["--check-config", badValue])
        #expect(valueStatus == 1)
        #expect(valueError.contains("bad config: \(badValue): [fluxd]: --durability must be always, batch or none"), "\(valueError)")
    }

    @Test("the file's settings apply, the command line wins; reload starts an added worker and applies the log level, refuses a socket change as a whole")
    func settingsAndReload() async throws {
        let dir = try TempDirectory(prefix: "fluxcfg")
        defer { dir.remove() }
        let file = dir.path + "/fluxd.toml"
        let socket = dir.path + "/bus.sock"
        let base = """
            [fluxd]
            socket = "bus.sock"
            log_format = "json"
            max_subscriptions = 7

            """
        try base.write(toFile: file, atomically: true, encoding: .utf8)
        // The file says json; the command line says text and wins.
        let fluxd = try Fluxd(arguments: ["--config", file, "--log-format", "text"], passSocket: false)
        let ready = try await fluxd.waitForReady()
        #expect(ready == "fluxd ready on \(socket)", "the socket comes from the file, relative to its directory")
        let client = try await withDeadline(.seconds(20), "connect") {
            try await FluxClient.connect(socketPath: socket, name: "operator", reconnect: .disabled)
        }
        #expect(client.welcome.limits.maxSubscriptions == 7, "max_subscriptions came from the file")
        #expect(fluxd.stderr.contains(" info fluxd: listening mode=600 path=\(socket)\n"), "text, as the command line said:\n\(fluxd.stderr)")

        // Nothing changed: an empty reload.
        #expect(try await client.reload() == ReloadResult(added: [], removed: [], changed: [], settings: []))

        // A worker and a log level added: started and applied.
        try (base + "log_level = \"debug\"\n\n[workers.todo]\ncommand = \"todo-store\"\nstores = [\"todos\"]\n")
            .write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try await client.reload() == ReloadResult(added: ["todo"], removed: [], changed: [], settings: ["log_level"]))
        let running = try await withDeadline(.seconds(20), "todo running") {
            while true {
                if try await client.workers().first(where: { $0.name == "todo" })?.state == .running { return true }
                try await Task.sleep(for: .milliseconds(50))  // polling interval: the worker's state decides
            }
        }
        #expect(running)

        // drain_timeout (read by the host, not an option): applied by an ephemeral fluxd, and listed.
        try (base + "log_level = \"debug\"\ndrain_timeout = 7000\n\n[workers.todo]\ncommand = \"todo-store\"\nstores = [\"todos\"]\n")
            .write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try await client.reload() == ReloadResult(added: [], removed: [], changed: [], settings: ["drain_timeout"]))

        // A restart-only setting changed: refused as a whole, the running configuration kept.
        try (base.replacingOccurrences(of: "bus.sock", with: "other.sock") + "log_level = \"info\"\n")
            .write(toFile: file, atomically: true, encoding: .utf8)
        let refused = try #require(await refusal(client), "a socket change was accepted")
        #expect(refused.code == .reloadRefused)
        #expect(refused.message.contains("socket (running: \(socket), file: \(dir.path)/other.sock): needs a restart"), "\(refused.message)")
        #expect(try await client.workers().map(\.name) == ["todo"], "the worker the refused file dropped still runs")

        // A file that does not parse: refused with its file and line, nothing changed.
        try "[workers.todo\ncommand = \"todo-store\"\n".write(toFile: file, atomically: true, encoding: .utf8)
        let broken = try #require(await refusal(client), "a broken file was accepted")
        #expect(broken.code == .reloadRefused)
        #expect(broken.message.contains("\(file):1:"), "\(broken.message)")
        #expect(try await client.workers().map(\.name) == ["todo"])
        await client.close()
        fluxd.send(signal: SIGTERM)
        #expect(await fluxd.waitForExit(timeout: .seconds(20)) == 0)
        await fluxd.shutDown()
    }

    @Test("reload without a config file is refused with reload-refused")
    func reloadWithoutConfig() async throws {
        try await withBus { bus in
            let client = try await bus.connect("operator")
            let refused = try #require(await refusal(client), "reload without a config file succeeded")
            #expect(refused.code == .reloadRefused && refused.message.contains("started without --config"), "\(refused.message)")
        }
    }
}
