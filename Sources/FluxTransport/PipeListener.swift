import CLibUV
import Glibc

/// Receives connections accepted by a `PipeListener` (on the loop thread).
public protocol ListenerDelegate: AnyObject {
    /// A connection was accepted and is reading. Set its `delegate` here, or its frames are dropped.
    func listener(_ listener: PipeListener, accepted connection: Connection)
    /// Accepting failed (e.g. out of file descriptors). Called once per connection that could not be accepted
    /// (with `EMFILE`/`ENFILE` each waiting connection is closed at once, see `PipeListener`), or once per failed
    /// attempt when the cause is not a connection of its own. The listener keeps listening.
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

/// A listening Unix-domain socket that accepts `Connection`s: the socket is fluxd's own (`socket`, `bind`,
/// `listen`), watched by a `uv_poll_t`, and each accepted descriptor is handed to a `uv_pipe_t` (`uv_pipe_open`).
/// Accepting ourselves rather than through `uv_listen` lets fluxd see every failure: libuv handles `EMFILE` and
/// `ENFILE` inside its accept loop and drops the waiting connections without telling the callback.
///
/// Binding is careful about the path: it refuses a path that is not a socket, refuses when a live server accepts
/// connections there (`TransportError.addressInUse`), removes a stale socket file, and creates the socket with
/// exactly `options.mode` (umask set around `bind`). Check and bind are serialised between processes with an
/// `flock` on the parent directory, so two servers starting at once cannot both take the path.
///
/// Out of descriptors (`EMFILE`, `ENFILE`), it does what libuv does: it gives up a descriptor held in reserve
/// (`/dev/null`), accepts each waiting connection and closes it at once (the client sees end of stream instead of
/// waiting in the backlog until it gives up), and takes the reserve back; the delegate hears one `acceptFailed`
/// per connection closed so. After a failure that leaves the connection waiting (no reserve, `ENOBUFS`,
/// `ENOMEM`, ...) it stops watching the socket for 100 ms, so the loop does not spin on it.
///
/// A socket passed by a service manager (systemd socket activation) is served through `adopting(...)`: the same
/// watching and accepting, but nothing is bound and the file is never unlinked.
///
/// Handle lifecycle: `listen(...)` binds and listens (`adopting(...)` takes a listening descriptor), then inits the poll handle (which retains this object) and
/// starts it; `close()` stops accepting at once, unlinks the socket file if it is still the one we bound, closes
/// the socket, the reserve descriptor, the pause timer and the handle; the memory is freed and the delegate
/// released in the close callback. Connections already accepted are unaffected.
public final class PipeListener: HandleOwner {
    /// The socket path.
    public let path: String
    /// Who hears about accepted connections. Held strongly until the listener closed.
    public var delegate: (any ListenerDelegate)?
    private let options: ListenerOptions
    /// Identity of the socket file we created, so that `close()` never unlinks somebody else's.
    private var boundFile: (dev: dev_t, ino: ino_t)?
    /// The listening socket (-1 before `bind` and after `close()`).
    private var socketFD: Int32 = -1
    /// A descriptor kept in reserve, given up to shed waiting connections when the descriptor table is full.
    private var reserveFD: Int32 = -1
    /// Restarts watching the socket after a pause (created on the first pause; closed by `close()`).
    private var pauseTimer: LoopTimer?
    private var closeRequested = false

    private init(loop: EventLoop, path: String, options: ListenerOptions) {
        self.path = path
        self.options = options
        super.init(loop: loop, handleType: uv_poll_t.self)
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
            listener.close()
            throw error
        }
        return listener
    }

    /// Serves a socket that is already bound and listening (socket activation: the service manager created it and
    /// passed it as `descriptor`, bound to `path`). Nothing is bound or created, and `close()` closes this
    /// process's descriptor but never unlinks `path`: the socket belongs to whoever created it, and connections keep
    /// queueing in its backlog while no fluxd serves it. The descriptor is made non-blocking and close-on-exec; it
    /// is watched and accepted from exactly like a socket of our own (same `EMFILE` handling). On failure the
    /// descriptor is closed.
    public static func adopting(
        listeningDescriptor descriptor: Int32, path: String, loop: EventLoop,
        options: ListenerOptions = ListenerOptions(), delegate: any ListenerDelegate
    ) throws(TransportError) -> PipeListener {
        let listener = PipeListener(loop: loop, path: path, options: options)
        listener.delegate = delegate
        listener.socketFD = descriptor
        do {
            try listener.watchAdopted()
        } catch {
            listener.delegate = nil
            listener.close()
            throw error
        }
        return listener
    }

    private func watchAdopted() throws(TransportError) {
        let statusFlags = fcntl(socketFD, F_GETFL)
        guard statusFlags >= 0, fcntl(socketFD, F_SETFL, statusFlags | O_NONBLOCK) == 0 else {
            throw .system(operation: "fcntl", path: path, errno: errno)
        }
        _ = fcntl(socketFD, F_SETFD, FD_CLOEXEC)
        reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC)
        try uvCheck(uv_poll_init(eventLoop.loop, typed(uv_poll_t.self), socketFD), "uv_poll_init")
        adopt()
        try uvCheck(uv_poll_start(typed(uv_poll_t.self), Int32(UV_READABLE.rawValue), listenerReadable), "uv_poll_start")
    }

    /// Stops accepting, removes the socket file (if it is still ours), closes the socket and the handle.
    /// Idempotent.
    public func close() {
        guard !closeRequested else { return }
        closeRequested = true
        if let boundFile {
            var st = stat()
            if lstat(path, &st) == 0, st.st_dev == boundFile.dev, st.st_ino == boundFile.ino {
                unlink(path)
            }
            self.boundFile = nil
        }
        pauseTimer?.close()
        pauseTimer = nil
        closeHandle() // stops polling at once (uv_close), so the descriptor may be closed now
        if socketFD >= 0 { Glibc.close(socketFD); socketFD = -1 }
        if reserveFD >= 0 { Glibc.close(reserveFD); reserveFD = -1 }
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

        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system(operation: "socket", path: path, errno: errno) }
        socketFD = fd
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: Array(path.utf8).prefix(raw.count - 1))
        }
        let oldMask = umask(~options.mode & 0o777)
        let bindResult = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        let bindErrno = errno
        umask(oldMask)
        if bindResult != 0 {
            if bindErrno == EADDRINUSE { throw .addressInUse(path: path) }
            throw .system(operation: "bind", path: path, errno: bindErrno)
        }

        var st = stat()
        if lstat(path, &st) == 0 { boundFile = (st.st_dev, st.st_ino) }
        guard Glibc.listen(fd, options.backlog) == 0 else { throw .system(operation: "listen", path: path, errno: errno) }
        reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC)
        try uvCheck(uv_poll_init(eventLoop.loop, typed(uv_poll_t.self), fd), "uv_poll_init")
        adopt()
        try uvCheck(uv_poll_start(typed(uv_poll_t.self), Int32(UV_READABLE.rawValue), listenerReadable), "uv_poll_start")
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

    /// The socket is readable: accept every waiting connection (until `EAGAIN`), like libuv's own accept loop.
    fileprivate func acceptWaiting(status: Int32) {
        if status < 0 {
            delegate?.listener(self, acceptFailed: UVError(code: status, operation: "uv_poll"))
            pause()
            return
        }
        while socketFD >= 0 && !closeRequested {
            let fd = Glibc.accept(socketFD, nil, nil)
            if fd >= 0 {
                adopt(accepted: fd)
                continue
            }
            let code = errno
            switch code {
            case EINTR, ECONNABORTED:
                continue
            case EAGAIN:
                return
            case EMFILE, ENFILE:
                shedWaitingConnections(code)
                return
            default:
                delegate?.listener(self, acceptFailed: UVError(code: -code, operation: "accept"))
                pause()
                return
            }
        }
    }

    /// Hands an accepted descriptor to a new `Connection` and the delegate.
    private func adopt(accepted fd: Int32) {
        // Not inherited by workers: they are spawned on this thread, never between accept and this call.
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        let connection: Connection
        do {
            connection = try Connection.adopting(descriptor: fd, loop: eventLoop, maxFrame: options.maxFrame)
        } catch {
            if case .uv(let uvError) = error { delegate?.listener(self, acceptFailed: uvError) }
            return
        }
        if let delegate {
            delegate.listener(self, accepted: connection)
        } else {
            connection.close(afterFlush: false)
        }
    }

    /// Out of descriptors: gives up the reserve descriptor to accept each waiting connection and close it at once,
    /// takes the reserve back, and reports one failure per connection closed (one if none was waiting any more).
    /// Without a reserve (it could not be reopened) the connections stay waiting and watching pauses.
    private func shedWaitingConnections(_ code: Int32) {
        var shed = 0
        if reserveFD >= 0 {
            Glibc.close(reserveFD)
            reserveFD = -1
            while true {
                let fd = Glibc.accept(socketFD, nil, nil)
                if fd >= 0 {
                    Glibc.close(fd)
                    shed += 1
                } else if errno != EINTR {
                    break
                }
            }
            reserveFD = open("/dev/null", O_RDONLY | O_CLOEXEC)
        }
        let error = UVError(code: -code, operation: "accept")
        for _ in 0..<max(shed, 1) where !closeRequested {
            delegate?.listener(self, acceptFailed: error)
        }
        if shed == 0 { pause() }
    }

    /// Stops watching the socket for 100 ms (after a failure that leaves the connection waiting).
    private func pause() {
        guard !closeRequested else { return }
        uvMust(uv_poll_stop(typed(uv_poll_t.self)), "uv_poll_stop")
        if pauseTimer == nil {
            pauseTimer = LoopTimer(loop: eventLoop) { [unowned self] in
                guard !self.closeRequested else { return }
                uvMust(uv_poll_start(self.typed(uv_poll_t.self), Int32(UV_READABLE.rawValue), listenerReadable),
                       "uv_poll_start")
            }
        }
        pauseTimer?.start(after: 100)
    }
}

private func listenerReadable(_ handle: UnsafeMutablePointer<uv_poll_t>?, _ status: Int32, _ events: Int32) {
    let listener = Unmanaged<PipeListener>.fromOpaque(handle!.pointee.data).takeUnretainedValue()
    let start = EventLoop.clock()  // every callback the loop runs counts towards its longest hold
    listener.acceptWaiting(status: status)
    listener.eventLoop.holdEnded(since: start)
}
