@testable import FluxDaemon
import Logging
import Testing

@Suite("[fluxd] settings: the file's keys as fluxd's options, and what a reload may change")
struct DaemonSettingsTests {
    private func parse(_ text: String) throws(ConfigError) -> SupervisorConfig {
        try SupervisorConfig.parse(text: text, path: "/etc/fluxbus/fluxd.toml", executableDirectory: nil)
    }

    @Test("a file with settings only is valid; values become the options' arguments, relative paths from the file's directory")
    func settingsOnly() throws {
        let config = try parse("""
            [fluxd]
            socket = "run/fluxd.sock"
            data_dir = "/var/lib/fluxbus"
            queue_limit = 10
            close_stalled_stores = true
            replay = false
            log_format = "json"
            """)
        #expect(config.workers.isEmpty)
        #expect(config.settings == ["socket": "/etc/fluxbus/run/fluxd.sock", "data_dir": "/var/lib/fluxbus", "queue_limit": "10",
                                    "close_stalled_stores": "true", "replay": "false", "log_format": "json"])
        #expect(DaemonSettings.arguments(config.settings) == [
            "--close-stalled-stores", "--data-dir", "/var/lib/fluxbus", "--log-format", "json", "--queue-limit", "10",
            "--socket", "/etc/fluxbus/run/fluxd.sock"])
    }

    @Test("wrong types are refused with the line and key")
    func wrongTypes() {
        let cases = [("[fluxd]\nqueue_limit = \"ten\"\n", "/etc/fluxbus/fluxd.toml:2: fluxd.queue_limit: must be a non-negative integer, not a string"),
                     ("[fluxd]\nephemeral = 1\n", "/etc/fluxbus/fluxd.toml:2: fluxd.ephemeral: must be true or false, not an integer")]
        for (text, problem) in cases {
            do {
                _ = try parse(text)
                Issue.record("accepted: \(text)")
            } catch {
                #expect(error.description == problem)
            }
        }
    }

    @Test("argument names map to keys; reload splits changes into live and restart-only, the command line's keys left out")
    func changes() {
        #expect(DaemonSettings.key(ofArgument: "--queue-limit") == "queue_limit")
        #expect(DaemonSettings.key(ofArgument: "--log-level=debug") == "log_level")
        #expect(DaemonSettings.key(ofArgument: "--config") == nil)
        let running = ["socket": "/a.sock", "log_level": "info", "queue_limit": "10"]
        let fresh = ["socket": "/b.sock", "log_level": "debug", "log_format": "json", "queue_limit": "10"]
        let split = DaemonSettings.changes(from: running, to: fresh, commandLine: [])
        #expect(split.live == ["log_format", "log_level"] && split.restart == ["socket"])
        let overridden = DaemonSettings.changes(from: running, to: fresh, commandLine: ["socket"])
        #expect(overridden.restart.isEmpty, "the command line sets the socket: the file's change does not matter")
        #expect(DaemonSettings.keys.filter(\.value.live).keys.sorted() == ["log_format", "log_level"])
    }
}

@Suite("fluxd's loop as its settings say")
struct DaemonLoopSettingsTests {
    @Test("--turn-micros sets the loop's turn (microseconds; a value too large for nanoseconds is no limit)")
    func turnMicros() throws {
        var config = DaemonConfig(socketPath: "/nonexistent/x.sock")
        config.turnMicros = 300
        let loop = try makeDaemonLoop(config: config, logger: Logger(label: "test"))
        #expect(loop.turnNanoseconds == 300_000)
        config.turnMicros = .max
        let unbounded = try makeDaemonLoop(config: config, logger: Logger(label: "test"))
        #expect(unbounded.turnNanoseconds == .max)
        #expect(DaemonSettings.option("turn_micros") == "--turn-micros")
    }
}
