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

/// The storage seam: the file the journal writes a segment through. `PosixFile` is the real one; tests put a file
/// that fails a chosen write, reservation or sync (EIO, ENOSPC) in its place, which is how fluxd's reaction to a
/// failing disk is tested without one.
public protocol AppendFile: AnyObject {
    /// The file's path (for messages).
    var path: String { get }
    /// Writes all of `bytes` at `offset` (a short write is retried until done or failed).
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StorageError)
    /// Makes what was written durable (`fdatasync`).
    func sync() throws(StorageError)
    /// Cuts the file back (or extends it) to `length` bytes.
    func truncate(to length: Int) throws(StorageError)
    /// Makes the file at least `end` bytes long, zeros past its old end, with the space allocated: records
    /// written there later cannot fail for lack of space, and a failure here for lack of space is how the journal
    /// learns the disk is full while it can still finish what it accepted. `writeZeros` writes the zeros (and
    /// syncs them) instead of only allocating them: records written over written zeros change no metadata, so
    /// their `fdatasync` is about half as long (ext4; what `always` pays for each group commit).
    func reserve(upTo end: Int, writeZeros: Bool) throws(StorageError)
    /// The file's length.
    func length() throws(StorageError) -> Int
    /// A second descriptor of the file (closed by the caller), for an `fdatasync` on another thread; nil where
    /// there is none (the journal then syncs on its own thread).
    func duplicateDescriptor() -> Int32?
    /// Closes it (idempotent).
    func close()
}

/// An `AppendFile` on a POSIX file descriptor.
public final class PosixFile: AppendFile {
    public let path: String
    @exclusivity(unchecked) private var fd: Int32

    /// Opens `path` for appending, creating it (mode 0600) when `create`.
    public init(path: String, create: Bool = true) throws(StorageError) {
        self.path = path
        fd = open(path, O_WRONLY | O_CLOEXEC | (create ? O_CREAT : 0), 0o600)
        guard fd >= 0 else { throw StorageError(operation: "open", errno: errno, path: path) }
    }

    deinit { close() }

    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int) throws(StorageError) {
        var done = 0
        while done < bytes.count {
            let n = cfluxsys_pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset + done))
            if n < 0 {
                if errno == EINTR { continue }
                throw StorageError(operation: "write", errno: errno, path: path)
            }
            done += n
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

    /// Zeros written at a time when a reservation grows the file.
    static let zeros = [UInt8](repeating: 0, count: 1 << 20)

    public func reserve(upTo end: Int, writeZeros: Bool) throws(StorageError) {
        var at = try length()
        guard at < end else { return }
        if !writeZeros {
            // Allocated, reading as zeros, the length extended (mode 0). A file system without fallocate: the
            // length only (the journal then learns of a full disk from a failed write, and holds frames).
            if cfluxsys_allocate(fd, off_t(at), off_t(end - at)) != 0 {
                guard errno == EOPNOTSUPP || errno == ENOSYS else {
                    throw StorageError(operation: "fallocate", errno: errno, path: path)
                }
                try truncate(to: end)
            }
            return
        }
        while at < end {
            let n = min(end - at, Self.zeros.count)
            var failure: StorageError?
            Self.zeros.withUnsafeBytes { raw in
                do throws(StorageError) { try write(UnsafeRawBufferPointer(rebasing: raw[0..<n]), at: at) } catch { failure = error }
            }
            if let failure { throw failure }
            at += n
        }
        try sync()  // the new length is durable before records go into it
    }

    public func length() throws(StorageError) -> Int {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw StorageError(operation: "fstat", errno: errno, path: path) }
        return Int(st.st_size)
    }

    public func duplicateDescriptor() -> Int32? {
        guard fd >= 0 else { return nil }
        let copy = fcntl(fd, F_DUPFD_CLOEXEC, 0)
        return copy >= 0 ? copy : nil
    }

    public func close() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }
}
