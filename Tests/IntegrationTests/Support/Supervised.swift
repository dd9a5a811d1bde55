import Foundation
import Glibc
import Testing

/// A fluxd started with `--config FILE` (fluxd as a plugin host): the config lives in a temp directory of its own
/// (with any helper scripts), fluxd in the usual `Fluxd` harness. `cleanup()` stops fluxd (SIGTERM, then SIGKILL),
/// SIGKILLs any worker pid the test saw that is still alive, and removes both directories.
final class SupervisedFluxd: @unchecked Sendable {
    // @unchecked: one test drives it.
    let configDirectory: TempDirectory
    let configPath: String
    let fluxd: Fluxd
    /// Every worker pid seen through `workers()` (killed by `cleanup()` if a test failed half-way).
    private(set) var seenPIDs: Set<Int32> = []

    /// Writes `config` (and `files`: name -> contents, made executable) and starts fluxd with it and `arguments`.
    /// Waits for the ready line unless `waitForReady` is false.
    init(config: String, files: [String: String] = [:], arguments: [String] = [], waitForReady: Bool = true) throws {
        configDirectory = try TempDirectory(prefix: "fluxsup")
        configPath = configDirectory.path + "/fluxd.toml"
        do {
            for (name, text) in files {
                let path = configDirectory.path + "/" + name
                try writeExecutable(path, text)
            }
            try config.write(toFile: configPath, atomically: true, encoding: .utf8)
            fluxd = try Fluxd(arguments: ["--config", configPath] + arguments)
        } catch {
            configDirectory.remove()
            throw error
        }
        if waitForReady {
            do { try fluxd.waitForReady() } catch { cleanup(); throw error }
        }
    }

    deinit { cleanup() }

    var socketPath: String { fluxd.socketPath }

    /// Replaces the config file (for SIGHUP reload tests).
    func rewrite(config: String) throws {
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    /// The `workers` reply, by worker name.
    func workers() throws -> [String: [String: Any]] {
        let peer = try RawPeer.ready(socketPath, name: "supervisor-test")
        try peer.send(frame: #"{"op":"workers","id":"w"}"#)
        let reply = try peer.expect("workers")
        var result: [String: [String: Any]] = [:]
        for worker in reply.objects("workers") {
            if let name = worker["name"] as? String { result[name] = worker }
            if let pid = worker["pid"] as? Int { seenPIDs.insert(Int32(pid)) }
        }
        return result
    }

    /// Polls `workers()` until `predicate` holds (each poll is a fresh request; the deadline bounds the wait).
    @discardableResult
    func waitForWorkers(_ what: String, timeout: Duration = .seconds(20),
                        _ predicate: ([String: [String: Any]]) -> Bool) throws -> [String: [String: Any]] {
        let deadline = ContinuousClock.now + timeout
        var last: [String: [String: Any]] = [:]
        while ContinuousClock.now < deadline {
            last = try workers()
            if predicate(last) { return last }
            usleep(20_000) // polling interval, not synchronisation: the predicate decides
        }
        throw HarnessError.timedOut("\(what); workers: \(last)")
    }

    /// Waits until fluxd's log contains `text`; returns the log.
    @discardableResult
    func waitForLog(_ text: String, timeout: Duration = .seconds(20)) throws -> String {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let log = fluxd.stderr
            if log.contains(text) { return log }
            usleep(20_000)
        }
        throw HarnessError.timedOut("fluxd log line containing \"\(text)\"; log:\n\(fluxd.stderr)")
    }

    func cleanup() {
        fluxd.cleanup()
        for pid in seenPIDs where processExists(pid) { kill(pid, SIGKILL) }
        configDirectory.remove()
    }
}

/// Stops a process with SIGSTOP and waits (with a deadline) until the kernel shows it stopped: `kill` returns
/// before a process running on another CPU has stopped, and it may still handle a frame sent meanwhile.
func stopProcess(_ pid: Int32, timeout: Duration = .seconds(5)) throws {
    kill(pid, SIGSTOP)
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { break }
        let state = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces)
        if state.hasPrefix("T") { return }
        usleep(1000)
    }
    throw HarnessError.unexpectedOutput("process \(pid) did not stop within \(timeout)")
}

/// Whether a process with this pid exists (and is not a zombie).
func processExists(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
    // Field 3, after the parenthesised command name, is the state; Z = zombie.
    guard let close = stat.lastIndex(of: ")") else { return true }
    let rest = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces)
    return !rest.hasPrefix("Z")
}

/// Runs `body` with a supervised fluxd and always cleans up; on failure records fluxd's log.
func withSupervisedFluxd<T>(config: String, files: [String: String] = [:], arguments: [String] = [],
                            _ body: (SupervisedFluxd) throws -> T) throws -> T {
    let host = try SupervisedFluxd(config: config, files: files, arguments: arguments)
    defer { host.cleanup() }
    do {
        return try body(host)
    } catch {
        Issue.record("fluxd log after failure:\n\(host.fluxd.stderr)")
        throw error
    }
}

extension Dictionary where Key == String, Value == [String: Any] {
    func state(_ worker: String) -> String? { self[worker]?["state"] as? String }
    func pid(_ worker: String) -> Int32? { (self[worker]?["pid"] as? Int).map(Int32.init) }
    func restarts(_ worker: String) -> Int? { self[worker]?["restarts"] as? Int }
}

/// Writes an executable file through a descriptor no process started meanwhile can keep (O_CLOEXEC): the test
/// process starts processes on other threads all the time, and a child that inherited a write descriptor of the
/// script makes exec fail with ETXTBSY ("Text file busy") for as long as it lives.
func writeExecutable(_ path: String, _ text: String) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o755)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(fd) }
    var bytes = Array(text.utf8)[...]
    while !bytes.isEmpty {
        let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        bytes = bytes.dropFirst(n)
    }
    fchmod(fd, 0o755)
}
