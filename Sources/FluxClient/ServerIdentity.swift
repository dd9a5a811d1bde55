#if canImport(Glibc)
import Glibc
#endif

/// The environment variable that names the uid fluxd must run as (a decimal number) for a client to use it.
public let serverUIDEnvironmentVariable = "FLUXBUS_SERVER_UID"

/// The uid the process listening on fluxd's socket must run as, or nil when any uid will do:
/// `explicit` if given, else `FLUXBUS_SERVER_UID` (`environmentValue`; empty counts as unset), else 0 when the client
/// runs as root (`clientEUID` 0: root never talks to a bus another user could have put in its place), else nil.
/// Throws `invalidArgument` when `FLUXBUS_SERVER_UID` is set but not a decimal uid (a typo must not turn the check off).
public func expectedServerUID(explicit: UInt32?, environmentValue: String?, clientEUID: UInt32) throws(FluxError) -> UInt32? {
    if let explicit { return explicit }
    if let text = environmentValue, !text.isEmpty {
        guard text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }), let uid = UInt32(text) else {
            throw .invalidArgument("\(serverUIDEnvironmentVariable) must be a uid (a decimal number), got \"\(text)\"")
        }
        return uid
    }
    return clientEUID == 0 ? 0 : nil
}

/// The server uid check: nil when `serverUID` (the listener's uid, from `SO_PEERCRED`) is acceptable, else the
/// `untrustedServer` error to refuse the connection with.
public func checkServerUID(_ serverUID: UInt32, expected: UInt32?, path: String) -> FluxError? {
    guard let expected, serverUID != expected else { return nil }
    return .untrustedServer(path: path, uid: serverUID, expected: expected)
}

/// `expectedServerUID` for this process: its environment and effective uid.
func expectedServerUIDFromEnvironment(explicit: UInt32?) throws(FluxError) -> UInt32? {
    let value = getenv(serverUIDEnvironmentVariable).map { String(cString: $0) }
    return try expectedServerUID(explicit: explicit, environmentValue: value, clientEUID: geteuid())
}

/// The credentials of the process at the other end of a connected Unix socket (`SO_PEERCRED`: for a connecting
/// client, those of the process that called `listen`).
func peerCredentials(of fd: Int32) throws(FluxError) -> (pid: Int32, uid: UInt32, gid: UInt32) {
    // struct ucred { pid_t pid; uid_t uid; gid_t gid; } (not visible to Swift without _GNU_SOURCE)
    var cred: (Int32, UInt32, UInt32) = (0, 0, 0)
    var length = socklen_t(MemoryLayout.size(ofValue: cred))
    guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0 else {
        throw .io(operation: "getsockopt(SO_PEERCRED)", errno: errno)
    }
    guard Int(length) == MemoryLayout.size(ofValue: cred) else {
        throw .io(operation: "getsockopt(SO_PEERCRED)", errno: EINVAL)
    }
    return (cred.0, cred.1, cred.2)
}
