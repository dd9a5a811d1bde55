import CFluxSys
#if canImport(Glibc)
import Glibc
#endif

/// Why a storage operation failed: the operation and the `errno` (e.g. `EIO`, `ENOSPC`).
public struct StorageError: Error, Sendable, Equatable, CustomStringConvertible {
    public var operation: String
    public var errno: Int32
    public var path: String

    public init(operation: String, errno: Int32, path: String) {
        self.operation = operation
        self.errno = errno
        self.path = path
    }

    /// Whether the disk is full (the journal stops accepting until space returns, and loses nothing).
    public var isDiskFull: Bool { errno == ENOSPC || errno == EDQUOT }

    public var description: String {
        "\(operation) of \(path) failed: \(String(cString: strerror(errno))) (errno \(errno))"
    }
}

/// The storage seam: an append-only file the journal writes through. `PosixFile` is the real one; tests put a file
/// that fails a chosen write or sync (EIO, ENOSPC) in its place, which is how fluxd's reaction to a failing disk is
/// tested without one.
public protocol AppendFile: AnyObject {
    /// The file's path (for messages).
    var path: String { get }
    /// Appends all of `bytes` (a short write is retried until done or failed).
    func append(_ bytes: UnsafeRawBufferPointer) throws(StorageError)
    /// Makes what was appended durable (`fdatasync`).
    func sync() throws(StorageError)
    /// Cuts the file back to `length` bytes (after a failed append: no half record stays behind).
    func truncate(to length: Int) throws(StorageError)
    /// Allocates disk space for `bytes` bytes from `offset` without changing the file's length (so appends into
    /// it cannot fail for lack of space): the journal keeps space reserved ahead of its writes, and a reservation
    /// that fails is how it learns the disk is full while it can still finish what it accepted.
    func reserve(from offset: Int, bytes: Int) throws(StorageError)
    /// Gives back the space reserved from `offset` on (a segment that is closed keeps only its records).
    func unreserve(from offset: Int, bytes: Int)
    /// The file's length.
    func length() throws(StorageError) -> Int
    /// Closes it (idempotent).
    func close()
}

/// An `AppendFile` on a POSIX file descriptor.
public final class PosixFile: AppendFile {
    public let path: String
    private var fd: Int32

    /// Opens `path` for appending, creating it (mode 0600) when `create`.
    public init(path: String, create: Bool = true) throws(StorageError) {
        self.path = path
        fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | (create ? O_CREAT : 0), 0o600)
        guard fd >= 0 else { throw StorageError(operation: "open", errno: errno, path: path) }
    }

    deinit { close() }

    public func append(_ bytes: UnsafeRawBufferPointer) throws(StorageError) {
        var offset = 0
        while offset < bytes.count {
            let n = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if n < 0 {
                if errno == EINTR { continue }
                throw StorageError(operation: "write", errno: errno, path: path)
            }
            offset += n
        }
    }

    public func sync() throws(StorageError) {
        // Never retried by the journal: after a failed fsync the kernel may have dropped the dirty pages
        // (PostgreSQL's "fsyncgate"), so a second success would prove nothing.
        guard fdatasync(fd) == 0 else { throw StorageError(operation: "fdatasync", errno: errno, path: path) }
    }

    public func truncate(to length: Int) throws(StorageError) {
        guard ftruncate(fd, off_t(length)) == 0 else { throw StorageError(operation: "ftruncate", errno: errno, path: path) }
    }

    public func reserve(from offset: Int, bytes: Int) throws(StorageError) {
        // FALLOC_FL_KEEP_SIZE (1): allocate, keep the length. A file system without fallocate reserves nothing
        // (the journal then learns of a full disk from a failed write, and holds frames until space returns).
        let r = cfluxsys_reserve(fd, off_t(offset), off_t(bytes))
        if r != 0 && errno != EOPNOTSUPP && errno != ENOSYS {
            throw StorageError(operation: "fallocate", errno: errno, path: path)
        }
    }

    public func unreserve(from offset: Int, bytes: Int) {
        guard bytes > 0 else { return }
        _ = cfluxsys_release(fd, off_t(offset), off_t(bytes))  // best effort: a file system without it keeps them
    }

    public func length() throws(StorageError) -> Int {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw StorageError(operation: "fstat", errno: errno, path: path) }
        return Int(st.st_size)
    }

    public func close() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }
}
