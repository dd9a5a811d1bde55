import ArgumentParser
#if FLUXBUS_JEMALLOC
import CJemalloc  // not when built with FLUXBUS_NO_JEMALLOC=1 (Package.swift), e.g. under AddressSanitizer
#endif
import FluxCore
import FluxDaemon
import Glibc
import Logging

/// `fluxd`: the FluxBus dispatcher daemon. Parses arguments, sets up logging, runs the daemon.
@main
struct Fluxd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fluxd",
        abstract: "The FluxBus dispatcher daemon.",
        discussion: """
            Listens on a Unix socket and prints "fluxd ready on <path>" to stdout once it accepts connections. \
            SIGINT/SIGTERM shut it down cleanly (exit 0). Logs go to stderr.
            """
    )

    @Option(name: .long, help: ArgumentHelp(
        "Socket path (default: $FLUXBUS_SOCKET, else $XDG_RUNTIME_DIR/fluxbus/fluxd.sock, else /tmp/fluxbus-<uid>/fluxd.sock).",
        valueName: "path"))
    var socket: String?

    @Option(name: .long, help: ArgumentHelp("Largest frame body accepted, in bytes.", valueName: "bytes"))
    var maxFrame: UInt32 = 1_048_576

    @Option(name: .long, help: ArgumentHelp("Actions queued at most for a store that is down.", valueName: "n"))
    var queueLimit: Int = 1024

    @Option(name: .long, help: ArgumentHelp("How long an action waits for a store that is down.", valueName: "ms"))
    var queueTimeout: UInt64 = 5000

    @Option(name: .long, help: ArgumentHelp("Actions delivered to a store before it answers the first.", valueName: "n"))
    var storeWindow: Int = 64

    @Option(name: .long, help: ArgumentHelp("How long a new connection has to send hello.", valueName: "ms"))
    var handshakeTimeout: UInt64 = 5000

    @Option(name: .long, help: ArgumentHelp(
        "Bytes that may wait unwritten for one connection before it is closed as a slow consumer (snapshots for a connection that is behind are coalesced first: newest wins).",
        valueName: "bytes"))
    var maxBacklog: Int = 64 << 20

    @Option(name: .long, help: ArgumentHelp("Permission bits of the socket file, in octal.", valueName: "octal"))
    var socketMode: String = "600"

    @Option(name: .long, help: ArgumentHelp(
        "A TOML file of store workers to start, supervise and stop (see examples/fluxd.toml). SIGHUP reloads it.",
        valueName: "file"))
    var config: String?

    @Option(name: .long, help: ArgumentHelp("trace, debug, info, notice, warning or error.", valueName: "level"))
    var logLevel: String = "info"

    func validate() throws {
        guard maxFrame > 0 else { throw ValidationError("--max-frame must be at least 1") }
        guard queueLimit >= 0 else { throw ValidationError("--queue-limit must not be negative") }
        guard storeWindow >= 1 else { throw ValidationError("--store-window must be at least 1") }
        guard maxBacklog >= Int(maxFrame) + 4 else {
            throw ValidationError("--max-backlog must be at least --max-frame + 4 (one whole frame)")
        }
        guard parsedSocketMode != nil else {
            throw ValidationError("--socket-mode must be octal permission bits (e.g. 600), got '\(socketMode)'")
        }
        guard parsedLogLevel != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error")
        }
    }

    private var parsedSocketMode: UInt32? {
        guard let mode = UInt32(socketMode, radix: 8), mode <= 0o777 else { return nil }
        return mode
    }

    private var parsedLogLevel: Logger.Level? {
        switch logLevel {
        case "trace", "debug", "info", "notice", "warning", "error": return Logger.Level(rawValue: logLevel)
        default: return nil
        }
    }

    func run() throws {
        let level = parsedLogLevel ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: "fluxd")
        logger.logLevel = level
        logger.debug("allocator", metadata: ["jemalloc": "\(jemallocVersion() ?? "?")"])

        // A bad config file is reported before anything listens or starts.
        var supervisorConfig: SupervisorConfig?
        if let path = self.config {
            do {
                supervisorConfig = try SupervisorConfig.load(path: path, executableDirectory: executableDirectory())
            } catch {
                writeAll(2, "fluxd: error: bad config: \(error)\n")
                throw ExitCode.failure
            }
        }

        var config = DaemonConfig(socketPath: socket ?? defaultSocketPath())
        config.socketMode = parsedSocketMode ?? 0o600
        config.router.maxFrame = maxFrame
        config.router.queueLimit = queueLimit
        config.router.queueTimeout = queueTimeout
        config.router.storeWindow = storeWindow
        config.router.handshakeTimeout = handshakeTimeout
        config.router.maxBacklog = maxBacklog

        do {
            try runPluginHost(config: config, supervisorConfig: supervisorConfig,
                              executableDirectory: executableDirectory(), logger: logger) { path in
                writeAll(1, "fluxd ready on \(path)\n")
            }
        } catch {
            writeAll(2, "fluxd: error: \(error)\n")
            throw ExitCode.failure
        }
    }
}

/// The version of jemalloc, fluxd's allocator (see Package.swift), as it reports it ("none" when fluxd was
/// built without it: FLUXBUS_NO_JEMALLOC=1).
private func jemallocVersion() -> String? {
    #if FLUXBUS_JEMALLOC
    var version: UnsafePointer<CChar>? = nil
    var length = MemoryLayout<UnsafePointer<CChar>?>.size
    guard mallctl("version", &version, &length, nil, 0) == 0, let version else { return nil }
    return String(cString: version)
    #else
    return "none (system malloc)"
    #endif
}

/// The directory of the running fluxd executable (bare worker commands are looked up there first).
private func executableDirectory() -> String? {
    guard let resolved = realpath("/proc/self/exe", nil) else { return nil }
    defer { free(resolved) }
    let path = String(cString: resolved)
    guard let slash = path.lastIndex(of: "/") else { return nil }
    return String(path[..<slash])
}

/// Writes a whole string to a file descriptor, unbuffered (the ready line must not sit in a stdio buffer).
private func writeAll(_ fd: Int32, _ text: String) {
    var bytes = Array(text.utf8)[...]
    while !bytes.isEmpty {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            return
        }
        bytes = bytes.dropFirst(n)
    }
}
