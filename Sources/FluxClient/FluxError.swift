import FluxCore
#if canImport(Glibc)
import Glibc
#endif

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

/// Why connecting to fluxd's socket failed, written for the person who has to fix it: the path tried, where that
/// path came from, what was found there, and what to do (`description`).
///
///     no fluxd at /run/user/1000/fluxbus/fluxd.sock (from the default path): no such socket
///       start one with:  fluxd --socket /run/user/1000/fluxbus/fluxd.sock
///       or connect to a running one: pass its socket path, or set FLUXBUS_SOCKET=PATH
public struct ConnectError: Sendable, Equatable, CustomStringConvertible {
    /// What was found at the path.
    public enum Problem: Sendable, Equatable {
        /// Nothing exists at the path (`ENOENT`).
        case noSuchSocket
        /// A socket file exists but nothing accepts connections on it (`ECONNREFUSED`): a fluxd that died
        /// without removing it, or another program's socket.
        case notListening
        /// The path is a directory (a socket path was expected: fluxd's socket is a file inside a directory).
        case isDirectory
        /// The path exists but is not a socket (a regular file, ...).
        case notASocket
        /// The socket, or a directory on the way, may not be opened by this user (`EACCES`, `EPERM`).
        case permissionDenied
        /// Another `connect(2)` failure.
        case other(errno: Int32)
    }

    /// The socket path tried.
    public var path: String
    /// Where the path came from, e.g. `the default path`, `$FLUXBUS_SOCKET`, `--socket` (tools set their own).
    public var source: String
    /// What was found there.
    public var problem: Problem
    /// The last line of advice: how to point the program at another fluxd. Tools replace it with their options.
    public var pointAtAnother: String

    public init(path: String, source: String, problem: Problem,
                pointAtAnother: String = "or connect to a running one: pass its socket path, or set FLUXBUS_SOCKET=PATH") {
        self.path = path
        self.source = source
        self.problem = problem
        self.pointAtAnother = pointAtAnother
    }

    /// The problem in a few words.
    public var reason: String {
        switch problem {
        case .noSuchSocket: return "no such socket"
        case .notListening: return "the socket exists but no fluxd is listening on it"
        case .isDirectory: return "it is a directory, not a socket"
        case .notASocket: return "it exists but is not a socket"
        case .permissionDenied: return "permission denied"
        case .other(let errno): return String(cString: strerror(errno))
        }
    }

    /// The advice lines (without the first line).
    public var advice: [String] {
        switch problem {
        case .isDirectory:
            let file = path.hasSuffix("/") ? path + "fluxd.sock" : path + "/fluxd.sock"
            return ["give the path of fluxd's socket file, not of its directory (e.g. \(file), where "
                        + "fluxd --socket \(file) listens)", pointAtAnother]
        case .notASocket:
            return ["fluxd's socket is made by fluxd itself: choose a path where nothing else lives, e.g. fluxd --socket \(path).sock",
                    pointAtAnother]
        case .permissionDenied:
            return ["the socket or a directory above it is not accessible to this user; connect as the user that runs fluxd",
                    pointAtAnother]
        case .noSuchSocket, .notListening, .other:
            return ["start one with:  fluxd --socket \(path)", pointAtAnother]
        }
    }

    public var description: String {
        (["no fluxd at \(path) (from \(source)): \(reason)"] + advice).joined(separator: "\n  ")
    }
}

/// Every error the client and store SDKs throw or report: one type to switch over.
///
/// - `.server`: fluxd answered with an `error` message; its `ErrorCode` says which rule was hit. Match one code with
///   `catch let e where e.code == .noHandler` (calls declare `throws(FluxError)`), or
///   `case .server(let e) where e.code == .noHandler` in a `switch`.
/// - `.rejected`: a store refused an action (`Settlement.requireDone()`), with the store's own code.
/// - `.timedOut`: a request got no answer in time (every request has a timeout, see `FluxClient.requestTimeout`).
/// - `.notSent`: a dispatch that certainly never reached fluxd (safe to dispatch again).
/// - `.cannotConnect`, `.disconnected`, `.closed`, `.io`, `.untrustedServer`: the connection.
/// - `.coding`, `.invalidArgument`, `.protocolViolation`, `.cancelled`: this side of the socket.
public enum FluxError: Error, Sendable, Equatable, CustomStringConvertible {
    /// fluxd answered with an `error` message (`ServerError.code` is the protocol's `ErrorCode`).
    case server(ServerError)
    /// A store refused an action with its own code (e.g. `todo/not-found`, or the store libraries' codes
    /// `store/bad-payload`, `store/unhandled-action`, `store/error`).
    case rejected(store: String, code: String, message: String)
    /// No fluxd could be reached at the socket path (the description says where it looked and what to do).
    case cannotConnect(ConnectError)
    /// The connection broke (EOF, I/O error, or fluxd closed it); the text says why. Pending requests fail with
    /// this and subscriptions finish with it.
    case disconnected(String)
    /// The connection was closed locally (`close()`), so the operation cannot proceed.
    case closed
    /// A system call failed (writing, reading, ...).
    case io(operation: String, errno: Int32)
    /// fluxd sent something this SDK cannot read, or the handshake did not go as the protocol says.
    case protocolViolation(String)
    /// A user type could not be encoded, or received JSON could not be decoded into it.
    case coding(String)
    /// An argument is not valid by the protocol's rules (bad store name, bad action type, ...); nothing was sent.
    case invalidArgument(String)
    /// An awaited answer did not come in time; the text says what was awaited.
    case timedOut(String)
    /// A dispatch never reached fluxd (it was made while reconnecting and the connection did not come back in
    /// time, or fluxd answered `recover` that it never accepted it, SPEC §15.4): it had no effect, and the caller
    /// may dispatch it again.
    case notSent(String)
    /// The task awaiting the call was cancelled.
    case cancelled
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
        case .rejected(let store, let code, let message): return "store \(store) rejected the action: \(code): \(message)"
        case .cannotConnect(let e): return e.description
        case .disconnected(let why): return "disconnected: \(why)"
        case .closed: return "the connection was closed"
        case .io(let op, let err): return "\(op) failed: \(String(cString: strerror(err))) (errno \(err))"
        case .protocolViolation(let what): return "protocol violation: \(what)"
        case .coding(let what): return "coding error: \(what)"
        case .invalidArgument(let what): return "invalid argument: \(what)"
        case .timedOut(let what): return "timed out: \(what)"
        case .notSent(let what): return "not sent: \(what)"
        case .cancelled: return "cancelled"
        case .untrustedServer(let path, let uid, let expected):
            return "fluxd at \(path) is run by uid \(uid), expected \(expected); set \(serverUIDEnvironmentVariable)=\(uid) to accept"
        }
    }
}
