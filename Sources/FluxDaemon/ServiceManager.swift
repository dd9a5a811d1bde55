import CFluxSys
import Glibc

/// systemd's readiness protocol (`sd_notify(3)`), without libsystemd: when fluxd runs under a service manager
/// that set `NOTIFY_SOCKET` (`Type=notify`), fluxd tells it `READY=1` once it serves, `STOPPING=1` when it begins
/// a stop, `RELOADING=1` ... `READY=1` around a config reload, and `STATUS=` lines a person reads in
/// `systemctl status`. Each message is one datagram on a new `AF_UNIX SOCK_DGRAM` socket (`cfluxsys_notify`).
///
/// `fromEnvironment()` reads `NOTIFY_SOCKET` once and removes it from fluxd's environment (as
/// `sd_notify(unset_environment=1)` does), so that the workers fluxd spawns do not inherit it and talk to systemd
/// in fluxd's name. Without `NOTIFY_SOCKET` every call does nothing. Messages are rare and small; a failure to send
/// one is returned (and fluxd logs it), never fatal: readiness is a courtesy to the service manager.
public final class ServiceNotifier: Sendable {
    /// The address messages go to (a path or `@abstract`), nil when fluxd was not started with `NOTIFY_SOCKET`.
    public let address: String?

    /// A notifier that sends to `address` (nil: sends nothing).
    public init(address: String?) {
        self.address = address.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The notifier `NOTIFY_SOCKET` asks for; removes `NOTIFY_SOCKET` from the environment. Call before any other
    /// thread reads the environment and before any worker is spawned.
    public static func fromEnvironment() -> ServiceNotifier {
        let value = getenv("NOTIFY_SOCKET").map { String(cString: $0) }
        unsetenv("NOTIFY_SOCKET")
        return ServiceNotifier(address: value)
    }

    /// Whether a service manager listens.
    public var isActive: Bool { address != nil }

    /// Sends `fields` (`NAME=value` each, no newlines inside) as one message. Returns nil when sent (or nothing to
    /// send to), else the `errno` of the failure.
    @discardableResult
    public func notify(_ fields: [String]) -> Int32? {
        guard let address, !fields.isEmpty else { return nil }
        let message = fields.map { $0.replacingNewlines() }.joined(separator: "\n")
        let rc = message.withCString { cfluxsys_notify(address, $0, strlen($0)) }
        return rc == 0 ? nil : -rc
    }

    /// `READY=1` with `STATUS=` and `MAINPID=` (fluxd's pid: under `sh -c 'exec fluxd'` it is the shell's).
    @discardableResult
    public func ready(status: String) -> Int32? {
        notify(["READY=1", "STATUS=\(status)", "MAINPID=\(getpid())"])
    }

    /// `STOPPING=1` with a status line.
    @discardableResult
    public func stopping(status: String) -> Int32? {
        notify(["STOPPING=1", "STATUS=\(status)"])
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=` (systemd 253+ wants it with every RELOADING=1) and a status line.
    @discardableResult
    public func reloading(status: String) -> Int32? {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let micros = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
        return notify(["RELOADING=1", "MONOTONIC_USEC=\(micros)", "STATUS=\(status)"])
    }

    /// A `STATUS=` line alone.
    @discardableResult
    public func status(_ text: String) -> Int32? {
        notify(["STATUS=\(text)"])
    }
}

private extension String {
    /// A field value on one line (a newline would start another field).
    func replacingNewlines() -> String {
        guard contains(where: \.isNewline) else { return self }
        return String(map { $0.isNewline ? " " : $0 })
    }
}

/// A listening socket handed over by the service manager (systemd socket activation, `sd_listen_fds(3)`).
public struct InheritedListener: Sendable, Equatable {
    /// The descriptor: `SD_LISTEN_FDS_START` (3). Close-on-exec once taken.
    public let descriptor: Int32
    /// The path the socket is bound to.
    public let path: String
    /// How many descriptors were passed (`LISTEN_FDS`); fluxd serves the first only.
    public let count: Int
}

/// Why a socket passed by the service manager cannot be used. The description is the message fluxd prints.
public enum SocketActivationError: Error, Equatable, CustomStringConvertible {
    /// `LISTEN_FDS` is not a number, or `LISTEN_PID` names fluxd but `LISTEN_FDS` is missing.
    case badEnvironment(String)
    /// fd 3 is not an open socket (`errno`), or not the kind of socket fluxd serves.
    case unusable(String)
    /// The socket is unnamed or abstract: clients and workers need a path.
    case noPath(String)

    public var description: String {
        switch self {
        case .badEnvironment(let text): return "socket activation: \(text)"
        case .unusable(let text): return "socket activation: file descriptor 3 \(text)"
        case .noPath(let address): return "socket activation: the socket passed has no path (address '\(address)'); fluxd serves a path"
        }
    }
}

/// Socket activation (`sd_listen_fds(3)`, the protocol only): `LISTEN_PID` is fluxd's pid and `LISTEN_FDS` >= 1,
/// so the service manager passed listening sockets from fd 3 (`SD_LISTEN_FDS_START`) on.
public enum SocketActivation {
    /// `SD_LISTEN_FDS_START`.
    public static let firstDescriptor: Int32 = 3

    /// The listening socket passed to this process, if any. Reads `LISTEN_PID`, `LISTEN_FDS` and
    /// `LISTEN_FDNAMES` and removes them from the environment in every case (workers must not think the sockets
    /// are theirs); marks every passed descriptor close-on-exec. Checks that fd 3 is a listening `AF_UNIX
    /// SOCK_STREAM` socket bound to a path. Returns nil when nothing was passed to this process (no `LISTEN_PID`,
    /// or another process's pid).
    public static func take() throws(SocketActivationError) -> InheritedListener? {
        let pid = getenv("LISTEN_PID").map { String(cString: $0) }
        let fds = getenv("LISTEN_FDS").map { String(cString: $0) }
        for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] { unsetenv(name) }
        guard let pid, let listenPID = Int32(pid), listenPID == getpid() else { return nil }
        guard let fds else { throw .badEnvironment("LISTEN_PID is set but LISTEN_FDS is not") }
        guard let count = Int(fds), count >= 0 else { throw .badEnvironment("LISTEN_FDS is not a count: '\(fds)'") }
        guard count >= 1 else { return nil }
        for fd in firstDescriptor..<firstDescriptor + Int32(clamping: count) {
            let flags = fcntl(fd, F_GETFD)
            if flags >= 0 { _ = fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }
        }
        let fd = firstDescriptor
        var buffer = [CChar](repeating: 0, count: 256)
        let rc = cfluxsys_listening_socket(fd, &buffer, buffer.count)
        switch rc {
        case 0: break
        case 1: throw .unusable("is not a Unix-domain (AF_UNIX) socket")
        case 2: throw .unusable("is not a stream (SOCK_STREAM) socket")
        case 3: throw .unusable("is not listening (systemd: ListenStream=, Accept=no)")
        default: throw .unusable("cannot be used: \(String(cString: strerror(-rc)))")
        }
        let path = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard path.hasPrefix("/") || (!path.isEmpty && !path.hasPrefix("@")) else { throw .noPath(path) }
        return InheritedListener(descriptor: fd, path: path, count: count)
    }
}
