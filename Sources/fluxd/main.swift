import ArgumentParser
#if FLUXBUS_JEMALLOC
import CJemalloc  // not when built with FLUXBUS_NO_JEMALLOC=1 (Package.swift), e.g. under AddressSanitizer
#endif
import FluxCore
import FluxDaemon
import FluxLog
import FluxJournal
import FluxRouter
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

            Under systemd (docs/systemd.md): with NOTIFY_SOCKET set (Type=notify) fluxd sends READY=1 once it \
            accepts connections, STOPPING=1 when it stops, RELOADING=1/READY=1 around a SIGHUP reload and STATUS= \
            lines. With LISTEN_PID (fluxd's pid) and LISTEN_FDS set (socket activation) it serves the listening \
            socket passed as file descriptor 3 instead of binding one, and leaves it in place when it stops.
            """,
        version: "fluxd \(FluxBusVersion.string)"
    )

    @Option(name: .long, help: ArgumentHelp(
        "Socket path (default: $FLUXBUS_SOCKET, else $XDG_RUNTIME_DIR/fluxbus/fluxd.sock, else ${TMPDIR:-/tmp}/fluxbus-<uid>/fluxd.sock).",
        discussion: """
            The default directory ($XDG_RUNTIME_DIR/fluxbus or ${TMPDIR:-/tmp}/fluxbus-<uid>) is created with mode 0700; \
            an existing one is used only if fluxd's user owns it and no group or other user can write to it. The \
            directory of an explicit path must exist, be owned by fluxd's user or root, and have the sticky bit if \
            group or other users can write to it. Otherwise fluxd refuses to start.
            """,
        valueName: "path"))
    var socket: String?

    @Option(name: .long, help: ArgumentHelp("Largest frame body accepted, in bytes.", valueName: "bytes"))
    var maxFrame: UInt32 = 1_048_576

    @Option(name: .long, help: ArgumentHelp("Actions queued at most for a store that is down.", valueName: "n"))
    var queueLimit: Int = 1024

    @Option(name: .long, help: ArgumentHelp(
        "How long an action waits for a store that is down (default: 300000 when durable, 5000 with --ephemeral).",
        valueName: "ms"))
    var queueTimeout: UInt64?
    @Option(name: .long, help: ArgumentHelp(
        "Where the journal lives (default: $XDG_STATE_HOME/fluxbus/<bus>, else ~/.local/state/fluxbus/<bus>, <bus> derived from the socket path). Locked while fluxd runs.",
        valueName: "dir"))
    var dataDir: String?
    @Flag(name: .long, help: "Keep everything in memory only: a restart loses all state (tests, throwaway buses).")
    var ephemeral = false
    @Option(name: .long, help: ArgumentHelp(
        "When journal records are synced: always (before the frames that reveal them), batch (every --sync-interval ms), none (never by fluxd). See docs/journal.md.",
        valueName: "mode"))
    var durability: String = "batch"
    @Option(name: .long, help: ArgumentHelp("batch: the longest time written records stay unsynced.", valueName: "ms"))
    var syncInterval: UInt64 = 100
    @Flag(name: .long, help: "Accept dispatch.seq: actions replayed with the seqs they had (fluxctl replay into fresh stores).")
    var replay = false
    @Flag(name: .long, help: "Cut a corrupt journal back to its last good record (saying what is lost) instead of refusing to start.")
    var repair = false
    @Option(name: .long, help: ArgumentHelp("A journal segment is closed (and a checkpoint written) once it holds this many bytes.", valueName: "bytes"))
    var segmentBytes: Int = 64 << 20
    @Option(name: .long, help: ArgumentHelp("A checkpoint (and a new segment) comes earlier, once the segment holds this many bytes and at least as many as the last checkpoint took.", valueName: "bytes"))
    var checkpointBytes: Int = 8 << 20
    @Option(name: .long, help: ArgumentHelp("History kept: at least the newest this many actions (older segments behind a checkpoint are deleted).", valueName: "n"))
    var retainActions: UInt64 = 1_000_000
    @Option(name: .long, help: ArgumentHelp("History kept: actions younger than this many hours.", valueName: "hours"))
    var retainHours: UInt64 = 7 * 24
    @Option(name: .long, help: ArgumentHelp("History kept: at most this many bytes of journal files (older segments behind a checkpoint are deleted first, whatever --retain-actions and --retain-hours say). 0: half the data directory's file system, at most 4 GiB.", valueName: "bytes"))
    var retainBytes: Int = 0
    @Option(name: .long, help: ArgumentHelp("The journal's bytes one user (uid) may hold (its records since the last checkpoint and its part of the checkpoints) before its new work is refused disk-quota. 0: a quarter of the retained bytes.", valueName: "bytes"))
    var diskPerUser: Int = 0

    @Option(name: .long, help: ArgumentHelp("Actions delivered to a store before it answers the first.", valueName: "n"))
    var storeWindow: Int = 64

    @Option(name: .long, help: ArgumentHelp("How long a new connection has to send hello.", valueName: "ms"))
    var handshakeTimeout: UInt64 = 5000

    @Option(name: .long, help: ArgumentHelp(
        "Bytes that may wait unwritten for one connection before it is closed as a slow consumer (snapshots for a connection that is behind are coalesced first: newest wins).",
        valueName: "bytes"))
    var maxBacklog: Int = 64 << 20

    @Option(name: .long, help: ArgumentHelp(
        "Bytes of recent patches kept per store so that delta subscribers resume with from after a reconnection (SPEC §16.3; 0: none).",
        valueName: "bytes"))
    var deltaHistory: Int = RouterConfig().deltaHistory

    @Option(name: .long, help: ArgumentHelp(
        "A full store queue still accepts dispatches from a connection with fewer unsettled actions than this.",
        valueName: "n"))
    var fairPending: Int = RouterConfig().fairPending

    @Option(name: .long, help: ArgumentHelp("Live queries one connection may hold.", valueName: "n"))
    var maxQueries: Int = RouterConfig().maxQueries

    @Option(name: .long, help: ArgumentHelp("Bytes of live query values one connection may hold.", valueName: "bytes"))
    var maxQueryBytes: Int = RouterConfig().maxQueryBytes

    @Option(name: .long, help: ArgumentHelp("Stores one connection may be subscribed to.", valueName: "n"))
    var maxSubscriptions: Int = RouterConfig().maxSubscriptions

    @Option(name: .long, help: ArgumentHelp("Stores one register may name in waitFor.", valueName: "n"))
    var maxWaitFor: Int = RouterConfig().maxWaitFor

    @Option(name: .long, help: ArgumentHelp("Connections accepted at once, from all users.", valueName: "n"))
    var maxConnections: Int = RouterConfig().maxConnections

    @Option(name: .long, help: ArgumentHelp("Connections one user (uid) may hold at once.", valueName: "n"))
    var maxConnectionsPerUser: Int = RouterConfig().maxConnectionsPerUser

    @Option(name: .long, help: ArgumentHelp("Connections that have not said hello yet.", valueName: "n"))
    var maxHandshakes: Int = RouterConfig().maxHandshakes

    @Option(name: .long, help: ArgumentHelp("Connections of one user (uid) that have not said hello yet.", valueName: "n"))
    var maxHandshakesPerUser: Int = RouterConfig().maxHandshakesPerUser

    @Option(name: .long, help: ArgumentHelp("Stores one connection may own at once.", valueName: "n"))
    var maxStoresPerConnection: Int = RouterConfig().maxStoresPerConnection

    @Option(name: .long, help: ArgumentHelp(
        "Bytes fluxd accounts for in total: unfinished frames, unwritten frames, unsettled actions, queries, retained snapshots (docs/limits.md).",
        valueName: "bytes"))
    var memoryBudget: Int = MemoryBudget.Limits().total

    @Option(name: .long, help: ArgumentHelp("Bytes of the memory budget one user (uid) may hold.", valueName: "bytes"))
    var memoryPerUser: Int = MemoryBudget.Limits().perUser

    @Option(name: .long, help: ArgumentHelp(
        "Dispatch outcomes one user (uid) may hold for recover: kept ones (each for 600000 ms after it settles) and unsettled session dispatches; more are refused outcome-quota (SPEC §15.4).",
        valueName: "n"))
    var maxOutcomes: Int = RouterConfig().maxOutcomes

    @Option(name: .long, help: ArgumentHelp(
        "Bytes each connection may use without drawing on the shared budget (reserved at connect).", valueName: "bytes"))
    var connectionAllowance: Int = MemoryBudget.Limits().connectionAllowance

    @Option(name: .long, help: ArgumentHelp(
        "How long a peer that asked for heartbeats may stay silent before it is pinged (0: no heartbeats).", valueName: "ms"))
    var pingInterval: UInt64 = RouterConfig().pingInterval

    @Option(name: .long, help: ArgumentHelp("Pings a peer may leave unanswered before it is closed.", valueName: "n"))
    var maxPingsOut: Int = RouterConfig().maxPingsOut

    @Option(name: .long, help: ArgumentHelp(
        "How long one connection's turn of reading may take before the others are served (at least 10).", valueName: "µs"))
    var turnMicros: UInt64 = 250

    @Option(name: .long, help: ArgumentHelp(
        "How long a store may leave an action unanswered before it is reported stalled (0: never).", valueName: "ms"))
    var storeTimeout: UInt64 = RouterConfig().storeTimeout

    @Flag(name: .long, help: "Close a stalled store's connection (unresponsive); a supervised worker is killed and restarted.")
    var closeStalledStores = false

    @Option(name: .long, help: ArgumentHelp("Permission bits of the socket file, in octal.", valueName: "octal"))
    var socketMode: String = "600"

    @Option(name: .long, help: ArgumentHelp(
        "A TOML file: fluxd's settings ([fluxd]: every option here, snake_case) and the store workers to start, supervise and stop (examples/fluxd.toml, docs/configuration.md). The command line overrides the file. SIGHUP or `fluxctl reload` reloads it.",
        valueName: "file"))
    var config: String?

    @Option(name: .long, help: ArgumentHelp(
        "Check a config file (TOML, every [fluxd] setting, the workers) and exit: 0 and a summary if fluxd could start with it, 1 and the problem if not. Starts nothing.",
        valueName: "file"))
    var checkConfig: String?

    @Option(name: .long, help: ArgumentHelp("trace, debug, info, notice, warning or error.", valueName: "level"))
    var logLevel: String = "info"

    @Option(name: .long, help: ArgumentHelp(
        "text (for people: time, level, label, the message, then key=value metadata; under systemd's journal no time and a <priority> prefix) or json (one object per line: time, level, label, message, metadata). See docs/logging.md.",
        valueName: "format"))
    var logFormat: String = "text"

    @Option(name: .long, help: ArgumentHelp(
        "Serve Prometheus metrics at http://ADDRESS/metrics: 127.0.0.1:PORT, [::1]:PORT or localhost:PORT (loopback only; port 0: any free one, logged). See docs/metrics.md.",
        valueName: "address"))
    var metrics: String?

    /// The largest `--max-frame` of a durable fluxd: half of what one journal record holds (`maxRecordBytes`),
    /// the rest for the record's fields and an action's target names.
    static let maxDurableFrame = maxRecordBytes / 2

    func validate() throws {
        guard maxFrame > 0 else { throw ValidationError("--max-frame must be at least 1") }
        // A journal record holds one frame's payload or state, with its fields and the action's target names: a
        // larger frame from a peer would stop a durable fluxd (the journal refuses a record past `maxRecordBytes`).
        guard ephemeral || Int(maxFrame) <= Self.maxDurableFrame else {
            throw ValidationError("--max-frame must be at most \(Self.maxDurableFrame) bytes (32 MiB) with a journal: one record holds a frame's payload or state; larger frames need --ephemeral")
        }
        guard queueLimit >= 0 else { throw ValidationError("--queue-limit must not be negative") }
        guard storeWindow >= 1 else { throw ValidationError("--store-window must be at least 1") }
        guard deltaHistory >= 0 else { throw ValidationError("--delta-history must be 0 or more bytes") }
        guard maxBacklog >= Int(maxFrame) + 4 else {
            throw ValidationError("--max-backlog must be at least --max-frame + 4 (one whole frame)")
        }
        for (name, value) in [("--max-queries", maxQueries), ("--max-query-bytes", maxQueryBytes),
                              ("--max-subscriptions", maxSubscriptions), ("--max-connections", maxConnections),
                              ("--max-connections-per-user", maxConnectionsPerUser), ("--max-handshakes", maxHandshakes),
                              ("--max-handshakes-per-user", maxHandshakesPerUser),
                              ("--max-stores-per-connection", maxStoresPerConnection),
                              ("--memory-budget", memoryBudget), ("--memory-per-user", memoryPerUser)] {
            guard value >= 1 else { throw ValidationError("\(name) must be at least 1") }
        }
        guard maxWaitFor >= 0, maxPingsOut >= 0, connectionAllowance >= 0, fairPending >= 0 else {
            throw ValidationError("--max-wait-for, --max-pings-out, --connection-allowance and --fair-pending must not be negative")
        }
        guard parsedSocketMode != nil else {
            throw ValidationError("--socket-mode must be octal permission bits (e.g. 600), got '\(socketMode)'")
        }
        guard Durability(rawValue: durability) != nil else {
            throw ValidationError("--durability must be always, batch or none, got '\(durability)'")
        }
        guard !(ephemeral && dataDir != nil) else {
            throw ValidationError("--ephemeral keeps no journal: it cannot be given with --data-dir")
        }
        if let metrics, case .failure(let error) = MetricsAddress.parse(metrics) {
            throw ValidationError("--metrics: \(error)")
        }
        guard LogFormat(rawValue: logFormat) != nil else {
            throw ValidationError("--log-format must be text or json, got '\(logFormat)'")
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

    /// The config file's `[fluxd]` settings become arguments before the command line's (which override them).
    static func main() {
        let given = Array(CommandLine.arguments.dropFirst())
        var fileArguments: [String] = []
        if let path = argumentValue("--check-config", in: given) ?? argumentValue("--config", in: given),
           let file = try? SupervisorConfig.load(path: path, executableDirectory: executableDirectory()) {
            fileArguments = DaemonSettings.arguments(file.settings)
            // A setting the file gets wrong is reported as the file's (an unreadable file is reported by run()).
            do {
                _ = try Fluxd.parseAsRoot(fileArguments)
            } catch {
                writeAll(2, "fluxd: error: bad config: \(path): [fluxd]: \(Fluxd.message(for: error)) (the file's keys are the options in snake_case)\n")
                Glibc.exit(1)
            }
        }
        Fluxd.main(fileArguments + given)
    }

    /// The value of `--name VALUE` or `--name=VALUE` (the last one given), if any.
    private static func argumentValue(_ name: String, in arguments: [String]) -> String? {
        var value: String?
        for (i, argument) in arguments.enumerated() {
            if argument == name, i + 1 < arguments.count { value = arguments[i + 1] }
            if argument.hasPrefix(name + "=") { value = String(argument.dropFirst(name.count + 1)) }
        }
        return value
    }

    func run() throws {
        if let path = checkConfig {
            // Every problem in one pass: the file's (syntax, keys, values) and what a start would run into (every
            // worker command that is not there), each with its line.
            let text: String
            do {
                text = try SupervisorConfig.readText(path: path)
            } catch {
                writeAll(2, "fluxd: error: bad config: \(error)\n")
                throw ExitCode.failure
            }
            let (checked, problems) = SupervisorConfig.check(text: text, path: path, executableDirectory: executableDirectory())
            let errors = (problems + (checked?.startProblems(text: text, searchPath: getenv("PATH").map { String(cString: $0) }) ?? []))
                .enumerated().sorted { ($0.element.line ?? 0, $0.offset) < ($1.element.line ?? 0, $1.offset) }.map(\.element)
            for error in errors { writeAll(2, "fluxd: error: bad config: \(error)\n") }
            if errors.count > 1 { writeAll(2, "fluxd: \(errors.count) problems in \(path)\n") }
            guard errors.isEmpty, let file = checked else { throw ExitCode.failure }
            let settings = file.fluxdKeys
            writeAll(1, "\(path): ok: \(file.workers.count) worker\(file.workers.count == 1 ? "" : "s")\(file.workers.isEmpty ? "" : " (" + file.workers.map(\.name).joined(separator: ", ") + ")"), \(settings.count) [fluxd] setting\(settings.count == 1 ? "" : "s")\(settings.isEmpty ? "" : " (" + settings.joined(separator: ", ") + ")")\n")
            return
        }
        // systemd's side of the process (docs/systemd.md), read first and taken out of the environment so that
        // no worker inherits it.
        let notifier = ServiceNotifier.fromEnvironment()
        let activated: InheritedListener?
        do {
            activated = try SocketActivation.take()
        } catch {
            writeAll(2, "fluxd: error: \(error)\n")
            throw ExitCode.failure
        }

        let level = parsedLogLevel ?? .info
        let logSettings = LogSettings(level: level, format: LogFormat(rawValue: logFormat) ?? .text)
        let journald = LogDestination.isJournal(journalStream: getenv("JOURNAL_STREAM").map { String(cString: $0) })
        LoggingSystem.bootstrap { label in
            FluxLogHandler(label: label, settings: logSettings, journald: journald)
        }
        var logger = Logger(label: "fluxd")
        logger.logLevel = level
        logger.notice("fluxd \(FluxBusVersion.string) starting", metadata: ["pid": "\(getpid())"])
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

        let location: SocketLocation
        if let activated {
            // The service manager made the socket (and its directory): fluxd serves it as it is.
            if let socket, !samePath(socket, activated.path) {
                writeAll(2, "fluxd: error: --socket \(socket) is not the socket the service manager passed (file descriptor 3 is bound to \(activated.path))\n")
                throw ExitCode.failure
            }
            location = SocketLocation(path: activated.path, privateDirectory: nil)
            if activated.count > 1 {
                logger.warning("socket activation passed more than one socket; serving the first",
                               metadata: ["LISTEN_FDS": "\(activated.count)", "path": "\(activated.path)"])
            }
        } else {
            // The socket's directory is checked (and a missing default one created 0700) before anything listens.
            location = socket.map { SocketLocation(path: $0, privateDirectory: nil) } ?? defaultSocketLocation()
            do {
                try prepareSocketDirectory(for: location)
            } catch {
                writeAll(2, "fluxd: error: \(error)\n")
                throw ExitCode.failure
            }
        }

        var config = DaemonConfig(socketPath: location.path)
        config.listenDescriptor = activated?.descriptor
        config.socketMode = parsedSocketMode ?? 0o600
        if let metrics, case .success(let address) = MetricsAddress.parse(metrics) { config.metricsAddress = address }
        config.router.maxFrame = maxFrame
        config.router.queueLimit = queueLimit
        config.router.queueTimeout = queueTimeout ?? (ephemeral ? 5000 : 300_000)
        config.router.storeWindow = storeWindow
        config.router.handshakeTimeout = handshakeTimeout
        config.router.maxBacklog = maxBacklog
        config.router.deltaHistory = deltaHistory
        config.router.debugLogs = level <= .debug
        config.router.fairPending = fairPending
        // Seqs reserved at a time (durable fluxd; 65,536): a test knob, so that the crash test crosses many
        // reservations, some of them made ahead (docs/journal.md).
        if let text = getenv("FLUXBUS_SEQ_BLOCK").map({ String(cString: $0) }), let block = UInt64(text), block >= 2 {
            config.router.seqBlock = block
        }
        config.router.maxQueries = maxQueries
        config.router.maxQueryBytes = maxQueryBytes
        config.router.maxSubscriptions = maxSubscriptions
        config.router.maxWaitFor = maxWaitFor
        config.router.maxConnections = maxConnections
        config.router.maxConnectionsPerUser = maxConnectionsPerUser
        config.router.maxHandshakes = maxHandshakes
        config.router.maxHandshakesPerUser = maxHandshakesPerUser
        config.router.maxStoresPerConnection = maxStoresPerConnection
        config.router.memory.total = memoryBudget
        config.router.memory.perUser = memoryPerUser
        config.router.maxOutcomes = max(1, maxOutcomes)
        config.router.memory.connectionAllowance = connectionAllowance
        config.router.pingInterval = pingInterval
        config.router.maxPingsOut = maxPingsOut
        config.turnMicros = max(10, turnMicros)
        config.router.storeTimeout = storeTimeout
        config.router.closeStalledStores = closeStalledStores
        config.router.replay = replay
        // Privileged operations (restart/stop workers, journal reads): fluxd's own user, root and the config's admins.
        config.router.admins = .owner(getuid(), uids: supervisorConfig?.adminUIDs ?? [], gids: supervisorConfig?.adminGIDs ?? [])

        var journal: Journal?
        if ephemeral {
            config.router.epoch = randomEpoch()
            config.router.durability = "ephemeral"
        } else {
            guard let dir = dataDir ?? defaultDataDirectory(socketPath: location.path) else {
                writeAll(2, "fluxd: error: no data directory: set --data-dir (or XDG_STATE_HOME or HOME), or run --ephemeral\n")
                throw ExitCode.failure
            }
            var options = Journal.Options(directory: dir)
            options.durability = Durability(rawValue: durability) ?? .batch
            options.syncInterval = syncInterval
            options.repair = repair
            options.segmentBytes = max(4096, segmentBytes)
            options.checkpointMinBytes = max(4096, checkpointBytes)
            options.retainActions = retainActions
            options.retainAge = retainHours * 3600 * 1000
            options.retainBytes = max(0, retainBytes)
            options.backgroundCheckpoints = true  // rollovers and checkpoints off the loop (docs/journal.md)
            options.diskPerUser = max(0, diskPerUser)
            options.outcomes = OutcomeLog(capacity: config.router.maxOutcomes, window: config.router.outcomeWindow)
            do {
                journal = try Journal(options: options)
            } catch {
                writeAll(2, "fluxd: error: \(error)\n")
                throw ExitCode.failure
            }
            config.router.epoch = journal!.epoch
            config.router.durability = options.durability.rawValue
            logger.info("journal", metadata: ["dir": "\(dir)", "durability": "\(options.durability.rawValue)"])
        }
        do {
            try runPluginHost(config: config, supervisorConfig: supervisorConfig,
                              executableDirectory: executableDirectory(), journal: journal, logger: logger,
                              notifier: notifier,
                              commandLine: Set(CommandLine.arguments.dropFirst().compactMap(DaemonSettings.key(ofArgument:))),
                              logSettings: logSettings) { path in
                writeAll(1, "fluxd ready on \(path)\n")
            }
        } catch {
            writeAll(2, "fluxd: error: \(error)\n")
            throw ExitCode.failure
        }
    }
}

/// Whether two socket paths name the same file: the same text, or the same file once their directories are
/// resolved (`--socket` may be written differently from the address systemd bound).
private func samePath(_ a: String, _ b: String) -> Bool {
    if a == b { return true }
    var sa = stat(), sb = stat()
    guard lstat(a, &sa) == 0, lstat(b, &sb) == 0 else { return false }
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino
}

/// A new epoch for an ephemeral run (SPEC §15.1): 16 random bytes in hex.
private func randomEpoch() -> String {
    var g = SystemRandomNumberGenerator()
    return (0..<2).map { _ in
        let hex = String(g.next(), radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }.joined()
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
