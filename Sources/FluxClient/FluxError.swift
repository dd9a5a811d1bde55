import FluxCore

/// An `error` message sent by fluxd: the stable code, the human text, and what it refers to.
public struct ServerError: Sendable, Equatable, CustomStringConvertible {
    /// The code exactly as sent (`"no-handler"`, ...).
    public var rawCode: String
    /// The human-readable text.
    public var message: String
    /// The id or store name the error refers to, if any.
    public var ref: String?
    /// Whether fluxd closes the connection after it.
    public var fatal: Bool

    public init(rawCode: String, message: String, ref: String? = nil, fatal: Bool = false) {
        self.rawCode = rawCode
        self.message = message
        self.ref = ref
        self.fatal = fatal
    }

    /// The protocol's error code, or nil for a code this SDK does not know (a newer fluxd).
    public var code: ErrorCode? { ErrorCode(rawValue: rawCode) }

    public var description: String {
        var s = "\(rawCode): \(message)"
        if let ref { s += " (ref \(ref))" }
        return s
    }
}

/// Every error the client and store SDKs throw or report.
///
/// Errors that come from fluxd are `.server`, carrying the stable `ErrorCode`; the other cases say what went wrong
/// on this side of the socket. Catch a specific protocol error with `catch let e as FluxError where e.code == .noHandler`.
public enum FluxError: Error, Sendable, Equatable, CustomStringConvertible {
    /// fluxd answered with an `error` message.
    case server(ServerError)
    /// The connection broke (EOF, I/O error, or fluxd closed it); the text says why. Pending requests fail with
    /// this and subscriptions finish with it.
    case disconnected(String)
    /// The connection was closed locally (`close()`), so the operation cannot proceed.
    case closed
    /// A system call failed (connecting, writing, ...).
    case io(operation: String, errno: Int32)
    /// fluxd sent something this SDK cannot read, or the handshake did not go as the protocol says.
    case protocolViolation(String)
    /// A user type could not be encoded, or received JSON could not be decoded into it.
    case coding(String)
    /// An argument is not valid by the protocol's rules (bad store name, bad action type, ...); nothing was sent.
    case invalidArgument(String)
    /// An awaited answer did not come in time.
    case timedOut(String)
    /// The process listening on the socket runs as another uid than the one expected (`FLUXBUS_SERVER_UID`, an
    /// explicit expected uid, or 0 for a client running as root): the connection was closed before anything was
    /// sent.
    case untrustedServer(path: String, uid: UInt32, expected: UInt32)

    /// The protocol error code when this is an error from fluxd.
    public var code: ErrorCode? {
        if case .server(let e) = self { return e.code }
        return nil
    }

    public var description: String {
        switch self {
        case .server(let e): return "fluxd error \(e)"
        case .disconnected(let why): return "disconnected: \(why)"
        case .closed: return "the connection was closed"
        case .io(let op, let err): return "\(op) failed: \(String(cString: strerror(err))) (errno \(err))"
        case .protocolViolation(let what): return "protocol violation: \(what)"
        case .coding(let what): return "coding error: \(what)"
        case .invalidArgument(let what): return "invalid argument: \(what)"
        case .timedOut(let what): return "timed out: \(what)"
        case .untrustedServer(let path, let uid, let expected):
            return "fluxd at \(path) is run by uid \(uid), expected \(expected); set \(serverUIDEnvironmentVariable)=\(uid) to accept"
        }
    }
}

#if canImport(Glibc)
import Glibc
#endif
