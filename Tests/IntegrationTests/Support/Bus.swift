import FluxClient
import Foundation
import Testing

/// One test's bus: a fluxd on a private socket, the example processes and FluxClients the test started.
/// `shutDown()` (called by `withBus`, also when the body throws or an expectation fails) or `cleanup()` (its blocking
/// form, called by `withBusBlocking`) aborts the clients, kills the processes, stops fluxd and removes its temp
/// directory.
final class Bus: @unchecked Sendable {
    let fluxd: Fluxd
    private let lock = NSLock()
    private var processes: [StoreProcess] = []
    private var clients: [FluxClient] = []

    private init(fluxd: Fluxd) {
        self.fluxd = fluxd
    }

    /// Starts fluxd and waits for it to be ready. Blocks.
    convenience init(fluxdArguments: [String]) throws {
        let fluxd = try Fluxd(arguments: fluxdArguments)
        do {
            try fluxd.waitForReady()
        } catch {
            fluxd.cleanup()
            throw error
        }
        self.init(fluxd: fluxd)
    }

    /// Starts fluxd and waits for it to be ready. Suspends.
    static func started(fluxdArguments: [String]) async throws -> Bus {
        let fluxd = try Fluxd(arguments: fluxdArguments)
        do {
            try await fluxd.waitForReady()
        } catch {
            await fluxd.shutDown()
            throw error
        }
        return Bus(fluxd: fluxd)
    }

    var socketPath: String { fluxd.socketPath }

    /// Starts an example executable and waits (suspended) for its ready line (`"<executable> ready"` unless given).
    func start(_ executable: String, _ arguments: [String] = [], readyLine: String? = nil,
               environment: [String: String] = [:]) async throws -> StoreProcess {
        let child = try launch(executable, arguments, environment: environment)
        try await child.waitForLine(containing: readyLine ?? "\(executable) ready")
        return child
    }

    /// `start` for synchronous tests (blocks).
    @discardableResult
    func startBlocking(_ executable: String, _ arguments: [String] = [], readyLine: String? = nil,
                       environment: [String: String] = [:]) throws -> StoreProcess {
        let child = try launch(executable, arguments, environment: environment)
        try child.waitForLine(containing: readyLine ?? "\(executable) ready")
        return child
    }

    private func launch(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> StoreProcess {
        let child = try StoreProcess(executable, socketPath: socketPath, arguments: arguments, environment: environment,
                                     logDirectory: fluxd.directory.path)
        lock.withLock { processes.append(child) }
        return child
    }

    /// Connects a FluxClient (aborted by `cleanup()`), with a deadline.
    func connect(_ name: String, role: Role = .client) async throws -> FluxClient {
        let path = socketPath
        let client = try await withDeadline(.seconds(20), "connect \(name)") {
            try await FluxClient.connect(socketPath: path, name: name, role: role)
        }
        lock.withLock { clients.append(client) }
        return client
    }

    /// What fluxd and every example process logged (for failure messages).
    var logs: String {
        let children = lock.withLock { processes }
        return (["fluxd:\n" + fluxd.stderr] + children.map { "\($0.executable) (pid \($0.pid)):\n" + $0.stderr })
            .joined(separator: "\n")
    }

    /// Tears everything down. Blocks (synchronous tests).
    func cleanup() {
        let (children, handles) = lock.withLock { (processes, clients) }
        for handle in handles { handle.abort() }
        for child in children { child.cleanup() }
        fluxd.cleanup()
    }

    /// Tears everything down. Suspends.
    func shutDown() async {
        let (children, handles) = lock.withLock { (processes, clients) }
        for handle in handles { handle.abort() }
        for child in children { await child.shutDown() }
        await fluxd.shutDown()
    }
}

/// Starts fluxd (with `fluxdArguments`), runs `body`, and always tears everything down (suspending, never blocking).
func withBus<T>(_ fluxdArguments: [String] = [], _ body: (Bus) async throws -> T) async throws -> T {
    let bus = try await Bus.started(fluxdArguments: fluxdArguments)
    let result: T
    do {
        result = try await body(bus)
    } catch {
        // Make the failure diagnosable: the logs of every process of this bus.
        Issue.record("bus logs after failure:\n\(bus.logs)")
        await bus.shutDown()
        throw error
    }
    await bus.shutDown()
    return result
}

/// `withBus` for synchronous (raw wire) tests.
func withBusBlocking<T>(_ fluxdArguments: [String] = [], _ body: (Bus) throws -> T) throws -> T {
    let bus = try Bus(fluxdArguments: fluxdArguments)
    defer { bus.cleanup() }
    do {
        return try body(bus)
    } catch {
        Issue.record("bus logs after failure:\n\(bus.logs)")
        throw error
    }
}

/// Runs blocking work (a raw socket read, a helper with no async form) from async code on a thread of its own, so it
/// never ties up the small cooperative pool (2 threads on a 2-core machine) that FluxClient continuations resume on.
func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { (c: CheckedContinuation<T, any Error>) in
        let thread = Thread {
            do { c.resume(returning: try body()) } catch { c.resume(throwing: error) }
        }
        thread.stackSize = 4 << 20
        thread.start()
    }
}

/// Runs `body` with a deadline: throws `HarnessError.timedOut(what)` (and cancels `body`) when it has not finished.
func withDeadline<T: Sendable>(
    _ timeout: Duration = .seconds(20), _ what: String, _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: timeout)
            throw HarnessError.timedOut("\(what) (after \(timeout))")
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}
