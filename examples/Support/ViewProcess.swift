import ArgumentParser
import FluxClient
import Foundation

/// One line of a view's stdin, parsed.
public protocol ViewCommand: Sendable, Equatable {
    /// Parses a line; nil for a blank one.
    init?(_ line: String)
    /// The command that ends the view (an enum's `case quit`).
    static var quit: Self { get }
}

extension ViewCommand {
    /// Whether the command ends the view.
    public var isQuit: Bool { self == .quit }
}

/// The run loop pieces every example view shares: connecting, following subscriptions onto the screen, reading
/// commands from stdin, and dispatching with settlement (refusals shown, read your writes).
public enum ViewProcess {
    /// Connects to fluxd as `name`; if it cannot, prints `NAME: cannot connect to fluxd at SOCKET: …` to stderr and
    /// throws exit code 1.
    public static func connect(_ connection: ConnectionOptions, name: String) async throws -> FluxClient {
        let socketPath = connection.socketPath
        do {
            return try await FluxClient.connect(socketPath: socketPath, name: name)
        } catch {
            Console.err("\(name): cannot connect to fluxd at \(socketPath): \(error)\n")
            throw ExitCode.failure
        }
    }

    /// Hands every event of `subscription` to `handle`, then calls `finished`. A lost connection (fluxd stopped)
    /// ends the view through `screen.connectionLost`.
    public static func follow<S>(
        _ subscription: Subscription<S>, on screen: some ViewScreen,
        _ handle: @escaping @Sendable (StoreEvent<S>) async -> Void, finished: @escaping @Sendable () -> Void = {}
    ) -> Task<Void, Never> {
        Task {
            do {
                for try await event in subscription { await handle(event) }
                finished()
            } catch {
                await screen.connectionLost(error)
            }
        }
    }

    /// Shows the errors fluxd reports outside any request as error lines.
    public static func showErrors(of client: FluxClient, on screen: some ViewScreen) -> Task<Void, Never> {
        Task {
            for await error in client.errors { await screen.error("\(error)") }
        }
    }

    /// Reads commands from stdin and performs each, until `quit` or the end of input.
    public static func readCommands<C: ViewCommand>(_ type: C.Type, perform: (C) async -> Void) async {
        for await line in Console.stdinLines() {
            guard let command = C(line) else { continue }
            if command.isQuit { break }
            await perform(command)
        }
    }

    /// Dispatches with `dispatch` and shows what went wrong: the error it threw (then nil is returned), or each
    /// store that refused (`CODE: message`) or was unavailable (`CODE: message (store NAME)`). When every store
    /// answered `done`, the error at the bottom of the screen is cleared.
    public static func settle(on screen: some ViewScreen, _ dispatch: () async throws -> Settlement) async -> Settlement? {
        let settlement: Settlement
        do {
            settlement = try await dispatch()
        } catch let error as FluxError {
            if case .server(let e) = error {
                await screen.error("\(e.rawCode): \(e.message)")
            } else {
                await screen.error("\(error)")
            }
            return nil
        } catch {
            await screen.error("\(error)")
            return nil
        }
        var failed = false
        for result in settlement.results {
            switch result.status {
            case .done:
                break
            case .rejected(let code, let message):
                failed = true
                await screen.error("\(code): \(message)")
            case .unavailable(let code, let message):
                failed = true
                await screen.error("\(code): \(message) (store \(result.store))")
            }
        }
        if !failed { await screen.clearError() }
        return settlement
    }

    /// Read your writes: fluxd sent the snapshots before the settlement (R5), so waits (at most 2 s) until
    /// `rendered` says they are on screen.
    public static func waitUntil(_ rendered: () async -> Bool) async {
        let deadline = ContinuousClock.now + .seconds(2)
        while await !rendered(), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }
}

extension Settlement {
    /// The version `store` answered `done` with; nil if it was not a target or did not answer `done`.
    public func doneVersion(_ store: String) -> Int? {
        if case .done(let version)? = self[store] { return version }
        return nil
    }
}
