import CLibUV
import Glibc

/// A failed libuv call: which call, libuv's error code and its text (`uv_strerror`).
public struct UVError: Error, Equatable, Sendable, CustomStringConvertible {
    /// libuv's (negative) error code, e.g. `UV_EADDRINUSE`.
    public let code: Int32
    /// The call that failed, e.g. `"uv_pipe_bind"`.
    public let operation: String

    public init(code: Int32, operation: String) {
        self.code = code
        self.operation = operation
    }

    /// libuv's symbolic name of the code, e.g. `"EADDRINUSE"`.
    public var name: String { String(cString: uv_err_name(code)) }
    /// libuv's human text for the code (`uv_strerror`).
    public var message: String { String(cString: uv_strerror(code)) }

    public var description: String { "\(operation): \(message) (\(name))" }
}

/// Why the transport could not do what it was asked to. Every case reads well as a one-line message.
public enum TransportError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A libuv call failed.
    case uv(UVError)
    /// A plain system call failed (`errno` and its `strerror` text).
    case system(operation: String, path: String, errno: Int32)
    /// Something accepted a connection on the socket path: another server owns it.
    case addressInUse(path: String)
    /// The path exists and is not a Unix socket; it is never removed.
    case notASocket(path: String)
    /// The path does not fit in `sockaddr_un.sun_path`.
    case pathTooLong(path: String, limit: Int)

    public var description: String {
        switch self {
        case .uv(let error):
            return error.description
        case .system(let operation, let path, let errno):
            return "\(operation) \(path): \(String(cString: strerror(errno)))"
        case .addressInUse(let path):
            return "another server is listening on \(path)"
        case .notASocket(let path):
            return "\(path) exists and is not a socket (refusing to remove it)"
        case .pathTooLong(let path, let limit):
            return "socket path is too long (\(path.utf8.count) bytes, at most \(limit)): \(path)"
        }
    }
}

/// Turns a libuv return code into a thrown `TransportError` (for failures the environment can cause).
@inline(__always)
func uvCheck(_ rc: Int32, _ operation: StaticString) throws(TransportError) {
    if rc < 0 { throw .uv(UVError(code: rc, operation: "\(operation)")) }
}

/// For libuv calls that can only fail through a bug of ours (wrong handle state, bad arguments).
@inline(__always)
func uvMust(_ rc: Int32, _ operation: StaticString, file: StaticString = #fileID, line: UInt = #line) {
    if rc < 0 {
        preconditionFailure("\(operation) failed: \(UVError(code: rc, operation: "\(operation)"))", file: file, line: line)
    }
}

/// libuv's error code for end of stream.
let uvEOF = Int32(UV_EOF.rawValue)
/// libuv's error code for a request cancelled because its handle closed.
let uvECANCELED = Int32(UV_ECANCELED.rawValue)
