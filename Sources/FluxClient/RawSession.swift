import FluxCore
import Foundation
import Synchronization

/// A protocol-unaware session for tools and conformance tests (fluxctl's raw mode): write any bytes or JSON
/// bodies, read every frame exactly as fluxd sent it. It does no handshake of its own; send `hello` yourself.
public final class RawSession: Sendable {
    /// The transport.
    public let connection: any FluxConnection
    /// Every received frame body, in order; finishes (with an error if the connection broke) when it ends.
    public let frames: AsyncThrowingStream<[UInt8], any Error>

    /// Starts reading from `connection`.
    public init(connection: any FluxConnection) {
        self.connection = connection
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: [UInt8].self, throwing: (any Error).self)
        frames = stream
        connection.start { event in
            switch event {
            case .frame(let body): continuation.yield(body)
            case .closed(let error): continuation.finish(throwing: error)
            }
        }
    }

    /// Opens a socket connection to fluxd (checking who listens there like `FluxClient.connect`).
    public convenience init(socketPath: String = defaultSocketPath(), expectedServerUID: UInt32? = nil) throws(FluxError) {
        self.init(connection: try SocketConnection(path: socketPath, expectedServerUID: expectedServerUID))
    }

    /// Sends one frame whose body is `json` (as UTF-8, unchecked).
    public func send(json: String) throws(FluxError) {
        try connection.send(body: Array(json.utf8))
    }

    /// Sends one frame with this body (unchecked).
    public func send(body: [UInt8]) throws(FluxError) {
        try connection.send(body: body)
    }

    /// Writes raw bytes (no framing added): for sending malformed or partial frames on purpose.
    public func sendBytes(_ bytes: [UInt8]) throws(FluxError) {
        try connection.send(bytes)
    }

    /// Closes the connection.
    public func close() { connection.close() }
}
