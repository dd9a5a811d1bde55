import FluxClient
import FluxCore
import Synchronization

/// A fake fluxd for testing SDK code frame by frame: it records every frame the SDK sends and lets the test
/// play fluxd's part by injecting frames (`reply(_:)`) and dropping the connection (`drop(_:)`).
///
///     let fake = ScriptedConnection()
///     async let client = FluxClient.connect(over: fake, name: "t")
///     let hello = try await fake.nextSent()                 // {"op":"hello",...}
///     fake.reply(#"{"op":"welcome","protocol":1,"server":"fake","peer":7,"limits":{}}"#)
public final class ScriptedConnection: FluxConnection {
    private struct State {
        var handler: (@Sendable (ConnectionEvent) -> Void)?
        var early: [ConnectionEvent] = []
        var decoder = FrameDecoder(maxFrame: 64 << 20)
        var closed = false
        var readCursor = 0
    }

    private let state = Mutex(State())
    /// Serializes deliveries so the SDK sees events one at a time, in order.
    private let delivery = Mutex(())
    private let sentLog = Recorder<[UInt8]>()

    public init() {}

    // MARK: FluxConnection

    public func start(_ handler: @escaping @Sendable (ConnectionEvent) -> Void) {
        delivery.withLock { _ in
            let early = state.withLock { s -> [ConnectionEvent] in
                precondition(s.handler == nil, "started twice")
                s.handler = handler
                defer { s.early = [] }
                return s.early
            }
            for e in early { handler(e) }
        }
    }

    public func send(_ bytes: [UInt8]) throws(FluxError) {
        let bodies = try state.withLock { s throws(FluxError) -> [[UInt8]] in
            if s.closed { throw .disconnected("the connection is closed") }
            s.decoder.append(bytes)
            var out: [[UInt8]] = []
            while let d = s.decoder.next() {
                if case .frame(let body) = d { out.append(body) }
            }
            return out
        }
        for b in bodies { sentLog.append(b) }
    }

    public func close() {
        emit(.closed(nil))
    }

    // MARK: Script side

    /// Every frame body the SDK sent so far, as text.
    public var sent: [String] { sentLog.elements.map { String(decoding: $0, as: UTF8.self) } }

    /// The next frame the SDK sends (after those already returned by this method), parsed; waits for it.
    public func nextSent(timeout: Duration = .seconds(5)) async throws -> Envelope {
        let index = state.withLock { s -> Int in
            defer { s.readCursor += 1 }
            return s.readCursor
        }
        let frames = try await sentLog.wait(timeout: timeout, "frame #\(index + 1) from the SDK") { $0.count > index }
        return try Envelope(body: frames[index])
    }

    /// Waits until the SDK has sent a frame with this `op` (at or after the read cursor; the cursor moves past it).
    public func nextSent(op: String, timeout: Duration = .seconds(5)) async throws -> Envelope {
        while true {
            let env = try await nextSent(timeout: timeout)
            if env.string("op").value == op { return env }
        }
    }

    /// Injects a frame from "fluxd".
    public func reply(_ json: String) {
        emit(.frame(Array(json.utf8)))
    }

    /// Injects a frame body from "fluxd".
    public func reply(body: [UInt8]) {
        emit(.frame(body))
    }

    /// Drops the connection as if fluxd went away.
    public func drop(_ reason: String = "fluxd closed the connection") {
        emit(.closed(.disconnected(reason)))
    }

    /// Whether the connection was closed (by either side).
    public var isClosed: Bool { state.withLock { $0.closed } }

    private func emit(_ event: ConnectionEvent) {
        delivery.withLock { _ in
            let handler = state.withLock { s -> (@Sendable (ConnectionEvent) -> Void)? in
                if s.closed { return nil }
                if case .closed = event { s.closed = true }
                if s.handler == nil {
                    s.early.append(event)
                    return nil
                }
                return s.handler
            }
            handler?(event)
        }
    }
}
