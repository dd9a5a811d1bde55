import CLibUV
import Glibc

/// Whether a failed start of a child process (`uv_spawn`'s error code, a negative `UV_E*` value) is about the command
/// itself — it will fail the same way until somebody fixes the config or the file system — or about the state of the
/// machine at that moment (descriptor table full, no memory, process limit), so a retry later may succeed.
public enum SpawnFailure: Equatable, Sendable {
    /// The command or working directory is missing or cannot be executed: `ENOENT`, `EACCES`, `ENOEXEC`,
    /// `ENOTDIR`, `ELOOP`, `ENAMETOOLONG`.
    case permanent
    /// Anything else: `EMFILE`, `ENFILE`, `EAGAIN`, `ENOMEM`, ...
    case transient

    /// The class of `uv_spawn`'s error code `code`.
    public init(uvCode code: Int32) {
        // libuv 1.44 has no UV_ENOEXEC; on Unix its codes are the negated errno values.
        switch code {
        case Int32(UV_ENOENT.rawValue), Int32(UV_EACCES.rawValue), Int32(UV_ENOTDIR.rawValue),
             Int32(UV_ELOOP.rawValue), Int32(UV_ENAMETOOLONG.rawValue), -ENOEXEC:
            self = .permanent
        default:
            self = .transient
        }
    }
}
