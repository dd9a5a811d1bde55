#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where fluxd listens and clients connect when no path is given, and which directory fluxd must own for it.
public struct SocketLocation: Equatable, Sendable {
    /// The socket path.
    public var path: String
    /// The per-user directory the default path lies in (`$XDG_RUNTIME_DIR/fluxbus` or `<temp dir>/fluxbus-<uid>`):
    /// fluxd creates it with mode 0700 and uses an existing one only if it owns it and nobody else may write to it
    /// (`checkPrivateSocketDirectory`). Nil when the path came from `$FLUXBUS_SOCKET`: then the path is explicit and
    /// only its parent directory is checked (`checkSocketParentDirectory`).
    public var privateDirectory: String?

    public init(path: String, privateDirectory: String?) {
        self.path = path
        self.privateDirectory = privateDirectory
    }
}

/// The one default-path rule of every FluxBus tool and SDK (and of the Python and Node clients, which run the same
/// cases: `protocol/vectors/socket-path.json`):
/// 1. `$FLUXBUS_SOCKET` if set and not empty;
/// 2. else `$XDG_RUNTIME_DIR/fluxbus/fluxd.sock` if `XDG_RUNTIME_DIR` is set and not empty;
/// 3. else `${TMPDIR:-/tmp}/fluxbus-<uid>/fluxd.sock` (an empty `TMPDIR` counts as unset), one bus per user.
/// Trailing slashes of `XDG_RUNTIME_DIR` and `TMPDIR` are dropped before joining (`TMPDIR=/var/tmp/` gives
/// `/var/tmp/fluxbus-<uid>/fluxd.sock`; `TMPDIR=/` gives `/fluxbus-<uid>/fluxd.sock`).
///
/// `environment` replaces the process environment (a missing key is an unset variable); `uid` replaces `getuid()`.
public func defaultSocketLocation(environment: [String: String]? = nil, uid: UInt32? = nil) -> SocketLocation {
    func env(_ key: String) -> String? {
        if let environment { return environment[key] }
        guard let v = getenv(key) else { return nil }
        return String(cString: v)
    }
    if let explicit = env("FLUXBUS_SOCKET"), !explicit.isEmpty {
        return SocketLocation(path: explicit, privateDirectory: nil)
    }
    if let runtime = env("XDG_RUNTIME_DIR"), !runtime.isEmpty {
        let directory = withoutTrailingSlashes(runtime) + "/fluxbus"
        return SocketLocation(path: directory + "/fluxd.sock", privateDirectory: directory)
    }
    let tmp = env("TMPDIR").flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
    let directory = withoutTrailingSlashes(tmp) + "/fluxbus-\(uid ?? UInt32(getuid()))"
    return SocketLocation(path: directory + "/fluxd.sock", privateDirectory: directory)
}

/// Where fluxd listens and clients connect when no path is given (see `defaultSocketLocation`): `$FLUXBUS_SOCKET`
/// if set, else `$XDG_RUNTIME_DIR/fluxbus/fluxd.sock`, else `${TMPDIR:-/tmp}/fluxbus-<uid>/fluxd.sock`.
public func defaultSocketPath(environment: [String: String]? = nil, uid: UInt32? = nil) -> String {
    defaultSocketLocation(environment: environment, uid: uid).path
}

private func withoutTrailingSlashes(_ path: String) -> String {
    var path = Substring(path)
    while path.last == "/" { path = path.dropLast() }
    return String(path)
}
