import ArgumentParser
import FluxClient
import FluxLog
import FluxStore
import Foundation
import Logging

/// How every example process logs: fluxd's format (`FluxLogging`, docs/logging.md), so that a store's lines, the
/// SDKs' and fluxd's read alike side by side. Called first thing in each example's `run()`.
public enum ExampleLogging {
    /// Bootstraps swift-log with fluxd's handler (level from `FLUXBUS_LOG_LEVEL`, default info).
    public static func bootstrap() { FluxLogging.bootstrap() }
}

/// A store process's own log (its actions, its readiness): info lines labelled with the store's name, in fluxd's
/// format once `ExampleLogging.bootstrap()` ran: `2026-11-28T14:39:46.123Z info todos: seq 1 todo/create ...`.
/// What the SDK logs itself (connection lost, reconnected, registering again) is not repeated here.
public struct StoreLog: Sendable {
    /// The store name, the lines' label.
    public let name: String
    private let logger: Logger

    public init(_ name: String) {
        self.name = name
        self.logger = Logger(label: name)
    }

    /// Logs `text` at info.
    public func callAsFunction(_ text: String) {
        logger.info("\(text)")
    }

    /// Logs `text` at error.
    public func error(_ text: String) {
        logger.error("\(text)")
    }
}

/// What every example store executable does once its handlers are installed: run the store, say it is ready,
/// unregister on a stop signal, and turn failures into an error line and exit code 1.
public enum StoreProcess {
    /// The command configuration of a store executable: its name, `abstract`, and a discussion saying that it
    /// prints `NAME ready` once registered, then logs `logs` to stderr, and how it stops.
    public static func configuration(
        commandName: String, abstract: String, logs: String = "one line per action"
    ) -> CommandConfiguration {
        CommandConfiguration(
            commandName: commandName,
            abstract: abstract,
            discussion: """
                Prints "\(commandName) ready" to stdout once registered with fluxd, then logs \(logs) to stderr. \
                SIGINT/SIGTERM unregister the store and exit 0.
                """
        )
    }

    /// Runs `store` on `connection`'s socket as peer `peerName` until SIGINT/SIGTERM (then it unregisters and
    /// returns, so the process exits 0) or a failure (logged at error as `PEER: …` on stderr, then exit code 1).
    ///
    /// Unanswerable errors of the store are logged at error. Once registered it prints `PEER ready` to stdout and
    /// logs `registered on SOCKET` followed by `details()` (label: the store's name).
    public static func run<State>(
        _ store: FluxStore<State>, connection: ConnectionOptions, peerName: String,
        details: () -> String = { "" }
    ) async throws {
        let log = StoreLog(store.name)
        store.onError { error in log.error("\(error)") }

        let socketPath = connection.socketPath
        let runner = Task { try await store.run(socketPath: socketPath, peerName: peerName) }
        let signals = Console.onStopSignal { signo in
            log("signal \(signo): unregistering")
            runner.cancel()
        }
        defer { withExtendedLifetime(signals) {} }

        do {
            try await store.ready()
            Console.out("\(peerName) ready\n")
            log("registered on \(socketPath)\(details())")
        } catch .cancelled {
            return
        } catch {
            log.error("\(peerName): \(error)")
            throw ExitCode.failure
        }
        do {
            try await runner.value
        } catch {
            log.error("\(peerName): \(error)")
            throw ExitCode.failure
        }
    }
}
