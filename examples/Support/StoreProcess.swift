import ArgumentParser
import FluxClient
import FluxStore
import Foundation

/// A store process's log on stderr: one line per call, prefixed with `[store name] `.
public struct StoreLog: Sendable {
    /// The store name shown in brackets.
    public let name: String

    public init(_ name: String) {
        self.name = name
    }

    /// Writes `[name] text` and a newline to stderr.
    public func callAsFunction(_ text: String) {
        Console.err("[\(name)] \(text)\n")
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
    /// returns, so the process exits 0) or a failure (logged as `PEER: error: …` on stderr, then exit code 1).
    ///
    /// Unanswerable errors of the store are logged as `[name] error`. Once registered it prints `PEER ready` to
    /// stdout and logs `[name] registered on SOCKET` followed by `details()` to stderr.
    public static func run<State>(
        _ store: FluxStore<State>, connection: ConnectionOptions, peerName: String,
        details: () -> String = { "" }
    ) async throws {
        let log = StoreLog(store.name)
        store.onError { error in log("\(error)") }

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
            Console.err("\(peerName): error: \(error)\n")
            throw ExitCode.failure
        }
        do {
            try await runner.value
        } catch {
            Console.err("\(peerName): error: \(error)\n")
            throw ExitCode.failure
        }
    }
}
