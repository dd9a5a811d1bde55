import FluxClient
import FluxCore
import Synchronization

/// A fake fluxd that can be reconnected to: each connection attempt of a client gets a new `ScriptedConnection`
/// (the test plays fluxd on each in turn), or fails as if no fluxd listened (`refuse(next:)`).
///
///     let fluxd = ScriptedConnector()
///     async let connecting = FluxClient.connect(name: "t", reconnect: .default, connector: fluxd.connector)
///     let first = try await fluxd.connection(0)
///     _ = try await first.nextSent(op: "hello")
///     first.reply(welcome)
///     first.drop()                                  // the client reconnects...
///     let second = try await fluxd.connection(1)    // ...on a new connection
public final class ScriptedConnector: Sendable {
    private let made = Recorder<ScriptedConnection>()
    private let state = Mutex((refusals: 0, attempts: 0))

    public init() {}

    /// The connector to give `FluxClient.connect(name:...:connector:)` or `FluxStore.run(peerName:...:connector:)`.
    public var connector: FluxClient.Connector {
        { [self] () throws(FluxError) -> any FluxConnection in try connect() }
    }

    private func connect() throws(FluxError) -> any FluxConnection {
        let refuse = state.withLock { s -> Bool in
            s.attempts += 1
            guard s.refusals > 0 else { return false }
            s.refusals -= 1
            return true
        }
        if refuse {
            throw .cannotConnect(ConnectError(path: "scripted", source: "a ScriptedConnector", problem: .notListening))
        }
        let connection = ScriptedConnection()
        made.append(connection)
        return connection
    }

    /// Makes the next `count` attempts fail with `cannotConnect` (no fluxd listening).
    public func refuse(next count: Int) {
        state.withLock { $0.refusals += count }
    }

    /// How many times the client tried to connect (refused attempts included).
    public var attempts: Int { state.withLock { $0.attempts } }

    /// The connection made by attempt `index` that was not refused (0: the first), waiting for it.
    public func connection(_ index: Int, timeout: Duration = .seconds(5)) async throws -> ScriptedConnection {
        try await made.wait(timeout: timeout, "connection #\(index + 1)") { $0.count > index }[index]
    }
}
