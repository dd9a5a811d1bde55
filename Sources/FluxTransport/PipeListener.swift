import CLibUV
import Glibc

/// Receives connections accepted by a `PipeListener` (on the loop thread).
public protocol ListenerDelegate: AnyObject {
    /// A connection was accepted and is reading. Set its `delegate` here, or its frames are dropped.
    func listener(_ listener: PipeListener, accepted connection: Connection)
    /// Accepting failed (e.g. out of file descriptors). The listener keeps listening.
    func listener(_ listener: PipeListener, acceptFailed error: UVError)
}

/// How a `PipeListener` creates its socket.
public struct ListenerOptions: Sendable {
    /// Permission bits of the socket file (applied race-free at bind time). Default 0600: owner only.
    public var mode: mode_t = 0o600
    /// `listen(2)` backlog.
    public var backlog: Int32 = 1024
    /// Create missing parent directories with mode 0700.
    public var createParentDirectory = true
    /// Largest frame body a connection accepts (its `FrameDecoder` limit).
    public var maxFrame: UInt32 = 1_048_576

    public init() {}
}

/// A listening Unix-domain socket (`uv_pipe_t`) that accepts `Connection`s.
///
/// Binding is careful about the path: it refuses a path that is not a socket, refuses when a live server accepts
/// connections there (`TransportError.addressInUse`), removes a stale socket file, and creates the socket with
/// exactly `options.mode` (umask set around `bind`). Check and bind are serialised between processes with an
/// `flock` on the parent directory, so two servers starting at once cannot both take the path.
///
/// Handle lifecycle: `listen(...)` inits the handle (which retains this object), binds and listens; `close()`
/// stops accepting at once, unlinks the socket file if it is still the one we bound, and closes the handle; the
/// memory is freed and the delegate released in the close callback. Connections already accepted are unaffected.
public final class PipeListener: HandleOwner {
    /// The socket path.
    public let path: String
    /// Who hears about accepted connections. Held strongly until the listener closed.
    public var delegate: (any ListenerDelegate)?
    private let options: ListenerOptions
    /// Identity of the socket file we created, so that `close()` never unlinks somebody else's.
    private var boundFile: (dev: dev_t, ino: ino_t)?

    private init(loop: EventLoop, path: String, options: ListenerOptions) {
        self.path = path
        self.options = options
        super.init(loop: loop, handleType: uv_pipe_t.self)
        uvMust(uv_pipe_init(loop.loop, typed(uv_pipe_t.self), 0), "uv_pipe_init")
        adopt()
    }

    /// Binds `path` and starts accepting. On failure nothing is left listening (the handle closes on the next
    /// loop iteration).
    public static func listen(
        loop: EventLoop, path: String, options: ListenerOptions = ListenerOptions(),
        delegate: any ListenerDelegate
    ) throws(TransportError) -> PipeListener {
        let limit = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1
        guard !path.isEmpty, path.utf8.count <= limit else { throw .pathTooLong(path: path, limit: limit) }
        let listener = PipeListener(loop: loop, path: path, options: options)
        listener.delegate = delegate
        do {
            try listener.bindAndListen()
        } catch {
            listener.delegate = nil
            listener.closeHandle()
            throw error
        }
        return listener
    }

    /// Stops accepting, removes the socket file (if it is still ours) and closes the handle. Idempotent.
    public func close() {
        guard !closeStarted else { return }
        if let boundFile {
            var st = stat()
            if lstat(path, &st) == 0, st.st_dev == boundFile.dev, st.st_ino == boundFile.ino {
                unlink(path)
            }
            self.boundFile = nil
        }
        closeHandle()
    }

    override func didClose() {
        delegate = nil
    }

    // MARK: - Binding

    private func bindAndListen() throws(TransportError) {
        let directory = parentDirectory(of: path)
        if options.createParentDirectory { try makeDirectories(directory) }
        // Serialise check-and-bind with other processes binding in the same directory.
        let lockFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard lockFD >= 0 else { throw .system(operation: "open", path: directory, errno: errno) }
        defer { Glibc.close(lockFD) }
        while flock(lockFD, LOCK_EX) != 0 {
            guard errno == EINTR else { throw .system(operation: "flock", path: directory, errno: errno) }
        }

        try removeStaleSocket()

        let pipe = typed(uv_pipe_t.self)
        let oldMask = umask(~options.mode & 0o777)
        let bindResult = uv_pipe_bind(pipe, path)
        umask(oldMask)
        if bindResult == Int32(UV_EADDRINUSE.rawValue) { throw .addressInUse(path: path) }
        try uvCheck(bindResult, "uv_pipe_bind")

        var st = stat()
        if lstat(path, &st) == 0 { boundFile = (st.st_dev, st.st_ino) }
        do {
            try uvCheck(uv_listen(UnsafeMutablePointer(OpaquePointer(pipe)), options.backlog, listenerConnection),
                        "uv_listen")
        } catch {
            close()
            throw error
        }
    }

    /// If `path` exists: refuse a non-socket, refuse a socket somebody accepts on, unlink a dead one.
    private func removeStaleSocket() throws(TransportError) {
        var st = stat()
        guard lstat(path, &st) == 0 else {
            if errno == ENOENT { return }
            throw .system(operation: "lstat", path: path, errno: errno)
        }
        guard st.st_mode & S_IFMT == S_IFSOCK else { throw .notASocket(path: path) }
        switch probeSocket(path) {
        case .live:
            throw .addressInUse(path: path)
        case .dead:
            guard unlink(path) == 0 || errno == ENOENT else {
                throw .system(operation: "unlink", path: path, errno: errno)
            }
        case .failed(let operation, let code):
            throw .system(operation: operation, path: path, errno: code)
        }
    }

    private enum Probe { case live, dead, failed(String, Int32) }

    /// Tries to connect to the socket at `path` (non-blocking; a full backlog also means somebody is there).
    private func probeSocket(_ path: String) -> Probe {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failed("socket", errno) }
        defer { Glibc.close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let bytes = Array(path.utf8)
            raw.copyBytes(from: bytes.prefix(raw.count - 1))
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        if rc == 0 { return .live }
        switch errno {
        case EAGAIN, EINPROGRESS: return .live
        case ECONNREFUSED, ENOENT: return .dead
        case let code: return .failed("connect", code)
        }
    }

    private func parentDirectory(of path: String) -> String {
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "." }
        if slash == path.utf8.startIndex { return "/" }
        return String(path[..<slash])
    }

    /// `mkdir -p` with mode 0700 for the components that are missing.
    private func makeDirectories(_ directory: String) throws(TransportError) {
        var st = stat()
        if stat(directory, &st) == 0 {
            guard st.st_mode & S_IFMT == S_IFDIR else { throw .system(operation: "mkdir", path: directory, errno: ENOTDIR) }
            return
        }
        guard errno == ENOENT else { throw .system(operation: "stat", path: directory, errno: errno) }
        let parent = parentDirectory(of: directory)
        if parent != directory { try makeDirectories(parent) }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw .system(operation: "mkdir", path: directory, errno: errno)
        }
    }

    // MARK: - Accepting

    fileprivate func accept(status: Int32) {
        if status < 0 {
            delegate?.listener(self, acceptFailed: UVError(code: status, operation: "connection"))
            return
        }
        let connection = Connection(loop: eventLoop, maxFrame: options.maxFrame)
        let server = UnsafeMutablePointer<uv_stream_t>(OpaquePointer(handle))
        let rc = uv_accept(server, connection.stream)
        if rc < 0 {
            connection.close(afterFlush: false)
            delegate?.listener(self, acceptFailed: UVError(code: rc, operation: "uv_accept"))
            return
        }
        do {
            try connection.startReading()
        } catch {
            connection.close(afterFlush: false)
            if case .uv(let uvError) = error { delegate?.listener(self, acceptFailed: uvError) }
            return
        }
        if let delegate {
            delegate.listener(self, accepted: connection)
        } else {
            connection.close(afterFlush: false)
        }
    }
}

private func listenerConnection(_ server: UnsafeMutablePointer<uv_stream_t>?, _ status: Int32) {
    let listener = Unmanaged<PipeListener>.fromOpaque(server!.pointee.data).takeUnretainedValue()
    listener.accept(status: status)
}
