import FluxClient
import FluxCore
import FluxRouter
import FluxStore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One end of a connection to an `InMemoryBus`, implementing `FluxConnection` (frames are split with a real
/// `FrameDecoder`, so malformed framing reaches the router as it would from a socket).
public final class InMemoryConnection: FluxConnection {
    private struct State {
        var handler: (@Sendable (ConnectionEvent) -> Void)?
        var decoder: FrameDecoder
        var closed = false
        var started = false
    }

    /// The peer id the router knows this connection by.
    public let peer: PeerID
    let credentials: PeerCredentials
    private let bus: InMemoryBus
    private let state: Mutex<State>

    init(bus: InMemoryBus, peer: PeerID, credentials: PeerCredentials, maxFrame: UInt32) {
        self.bus = bus
        self.peer = peer
        self.credentials = credentials
        self.state = Mutex(State(decoder: FrameDecoder(maxFrame: maxFrame)))
    }

    public func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) {
        let ok = state.withLock { s -> Bool in
            guard !s.started, !s.closed else { return false }
            s.started = true
            s.handler = handler
            return true
        }
        precondition(ok, "InMemoryConnection started twice or after close")
        bus.register(self)
    }

    public func send(_ bytes: [UInt8]) throws(FluxError) {
        // Decode and enqueue under this connection's lock so concurrent senders keep their order; drain outside it.
        let result = state.withLock { s -> Result<Bool, FluxError> in
            guard s.started else { return .failure(.protocolViolation("send before start")) }
            guard !s.closed else { return .failure(.disconnected("the connection is closed")) }
            s.decoder.append(bytes)
            var events: [RouterEvent] = []
            while let decoded = s.decoder.next() {
                switch decoded {
                case .frame(let body): events.append(.frame(peer, body))
                case .empty: events.append(.emptyFrame(peer))
                case .tooLarge(let length): events.append(.oversizedFrame(peer, length: length))
                }
            }
            return .success(events.isEmpty ? false : bus.enqueue(events))
        }
        switch result {
        case .failure(let error): throw error
        case .success(let mustDrain): if mustDrain { bus.drain() }
        }
    }

    public func close() {
        let handler = state.withLock { s -> (@Sendable (ConnectionEvent) -> Void)? in
            guard !s.closed else { return nil }
            s.closed = true
            defer { s.handler = nil }
            return s.handler
        }
        guard let handler else { return }
        bus.closedByClient(peer)
        handler(.closed(nil))
    }

    /// Delivery from the bus's pump (one at a time).
    func deliver(_ event: ConnectionEvent) {
        let handler = state.withLock { s in s.closed ? nil : s.handler }
        handler?(event)
    }

    /// The router closed this connection (after the frames sent before it).
    func closedByBus() {
        let handler = state.withLock { s -> (@Sendable (ConnectionEvent) -> Void)? in
            guard !s.closed else { return nil }
            s.closed = true
            defer { s.handler = nil }
            return s.handler
        }
        handler?(.closed(.disconnected("fluxd closed the connection")))
    }
}
