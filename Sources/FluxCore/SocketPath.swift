#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where fluxd listens and clients connect when no path is given: `$FLUXBUS_SOCKET` if set, else
/// `$XDG_RUNTIME_DIR/fluxbus/fluxd.sock`, else `<temp dir>/fluxbus-<uid>/fluxd.sock` (one bus per user).
public func defaultSocketPath(environment: [String: String]? = nil) -> String {
    func env(_ key: String) -> String? {
        if let environment { return environment[key] }
        guard let v = getenv(key) else { return nil }
        return String(cString: v)
    }
    if let explicit = env("FLUXBUS_SOCKET"), !explicit.isEmpty { return explicit }
    if let runtime = env("XDG_RUNTIME_DIR"), !runtime.isEmpty { return runtime + "/fluxbus/fluxd.sock" }
    let tmp = env("TMPDIR").flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
    return tmp + "/fluxbus-\(getuid())/fluxd.sock"
}
