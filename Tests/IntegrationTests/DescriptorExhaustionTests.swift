import Foundation
import Glibc
import Testing

/// fluxd out of file descriptors: connections it cannot accept are closed at once, counted and logged at most once
/// a second; a worker whose restart fails for lack of descriptors is retried with backoff and comes back.
@Suite("fluxd out of file descriptors", .onDedicatedThreads)
struct DescriptorExhaustionTests {
    static let config = """
        [workers.todo]
        command = "todo-store"
        stores = ["todos"]
        restart = "always"
        backoff = { initial = 0.05, factor = 2, max = 0.4 }
        intensity = { restarts = 100, within = 60 }

        """

    /// Open descriptors of a process.
    static func openDescriptors(_ pid: Int32) throws -> Int {
        try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count
    }

    /// Sets the soft RLIMIT_NOFILE of a running process (util-linux `prlimit`, as the same user).
    static func setSoftDescriptorLimit(_ pid: Int32, _ limit: Int) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/prlimit")
        process.arguments = ["--pid", "\(pid)", "--nofile=\(limit):"]
        process.standardInput = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw HarnessError.unexpectedOutput("prlimit --pid \(pid) --nofile=\(limit): exit \(process.terminationStatus)")
        }
    }

    /// Connects and says hello: the peer when fluxd welcomed it, nil when fluxd closed the connection instead.
    static func connect(_ path: String) throws -> RawPeer? {
        let peer = try RawPeer(connectingTo: path)
        do {
            try peer.send(frame: #"{"op":"hello","protocol":1,"role":"client","name":"hog"}"#)
        } catch {
            return nil // fluxd closed it before the hello went out (EPIPE)
        }
        switch try peer.next(timeout: .seconds(20)) {
        case .frame: return peer
        case .eof: return nil
        case .timeout: throw HarnessError.timedOut("welcome or end of stream from fluxd")
        }
    }

    static func lines(_ log: String, containing text: String) -> [Substring] {
        log.split(separator: "\n").filter { $0.contains(text) }
    }

    @Test("descriptors exhausted: refused connections are closed, counted and logged once; a SIGKILLed worker's restart fails with EMFILE, is retried, and the worker and its store come back once descriptors are free",
          .enabled(if: access("/usr/bin/prlimit", X_OK) == 0, "needs util-linux prlimit"),
          .timeLimit(.minutes(2)))
    func exhaustion() throws {
        try withSupervisedFluxd(config: Self.config) { host in
            let before = try host.waitForWorkers("todo running") { $0.state("todo") == "running" }
            let workerPID = try #require(before.pid("todo"))
            let fluxdPID = host.fluxd.pid

            // Room for a few more connections only. The respawned worker inherits this limit too (it needs far less).
            let limit = try Self.openDescriptors(fluxdPID) + 12
            try Self.setSoftDescriptorLimit(fluxdPID, limit)

            // Fill fluxd's descriptor table with connections, until one is closed instead of welcomed; then a few
            // more, all refused at once (no waiting in the backlog).
            var hogs: [RawPeer] = []
            defer { hogs.removeAll() }
            var refused = 0
            var firstRefusal: ContinuousClock.Instant?
            while refused < 6 {
                if let peer = try Self.connect(host.socketPath) {
                    #expect(refused == 0, "fluxd accepted a connection after refusing one while nothing was freed")
                    hogs.append(peer)
                    try #require(hogs.count < 200, "fluxd kept accepting past its descriptor limit of \(limit)")
                } else {
                    refused += 1
                    if firstRefusal == nil { firstRefusal = .now }
                }
            }
            let burst = ContinuousClock.now - firstRefusal!

            // One log line for the burst (at most one a second), naming EMFILE.
            var log = try host.waitForLog("accept failed")
            let acceptLines = Self.lines(log, containing: "accept failed")
            #expect(acceptLines.count >= 1)
            #expect(acceptLines.count <= 1 + Int(burst.components.seconds), "\(acceptLines)")
            #expect(acceptLines.count < refused)
            #expect(acceptLines.first?.contains("EMFILE") == true, "\(acceptLines)")

            // The worker dies; its restart cannot get descriptors (the ones it freed are too few for the pipes):
            // reported as transient and retried, not given up on.
            #expect(kill(workerPID, SIGKILL) == 0)
            log = try host.waitForLog("worker start failed for now")
            let retries = Self.lines(log, containing: "worker start failed for now")
            #expect(retries.first?.contains("EMFILE") == true || retries.first?.contains("ENFILE") == true, "\(retries)")
            #expect(!log.contains("worker cannot be started"))

            // Free the descriptors: the next retry starts the worker, whose store comes back up.
            hogs.removeAll()
            let after = try host.waitForWorkers("todo running again") {
                $0.state("todo") == "running" && $0.pid("todo") != nil && $0.pid("todo") != workerPID
            }
            #expect(after.restarts("todo") == 1)
            let peer = try RawPeer.ready(host.socketPath, name: "checker")
            let subscribed = try peer.subscribe("todos")
            #expect(subscribed.first?.string("status") == "up", "\(subscribed)")
            // Still only the one burst of accept failures in the log.
            #expect(Self.lines(host.fluxd.stderr, containing: "accept failed").count == acceptLines.count)
        }
    }
}
