import CLibUV
import Glibc

/// What to start: the executable and its arguments, environment and working directory.
public struct SpawnOptions: Sendable, Equatable {
    /// Path of the executable (`uv_spawn` runs it with `execvp`: a name without a slash is looked up in `PATH`).
    public var executable: String
    /// `argv[1...]` (`argv[0]` is `executable`).
    public var arguments: [String]
    /// The complete environment of the child, as `NAME=value` strings.
    public var environment: [String]
    /// Working directory (nil: fluxd's own).
    public var workingDirectory: String?
    /// Start the child in a session of its own (`setsid`), so a Ctrl-C in fluxd's terminal reaches fluxd only and
    /// fluxd stops its children in order.
    public var detached: Bool = true

    public init(executable: String, arguments: [String] = [], environment: [String] = [],
                workingDirectory: String? = nil) {
        self.executable = executable
        self.arguments = arguments
        self.environment = environment
        self.workingDirectory = workingDirectory
    }
}

/// How a child process ended.
public enum ProcessExit: Equatable, Sendable, CustomStringConvertible {
    /// It called `exit(status)`.
    case exited(Int32)
    /// A signal ended it.
    case signalled(Int32)

    /// Exit status 0.
    public var isSuccess: Bool { self == .exited(0) }

    public var description: String {
        switch self {
        case .exited(let status): return "exit status \(status)"
        case .signalled(let signal): return "killed by \(signalName(signal))"
        }
    }
}

/// The usual name of a signal number (`SIGKILL`), or `signal N`.
public func signalName(_ signal: Int32) -> String {
    switch signal {
    case SIGHUP: return "SIGHUP"
    case SIGINT: return "SIGINT"
    case SIGQUIT: return "SIGQUIT"
    case SIGILL: return "SIGILL"
    case SIGABRT: return "SIGABRT"
    case SIGBUS: return "SIGBUS"
    case SIGFPE: return "SIGFPE"
    case SIGKILL: return "SIGKILL"
    case SIGSEGV: return "SIGSEGV"
    case SIGPIPE: return "SIGPIPE"
    case SIGTERM: return "SIGTERM"
    case SIGTRAP: return "SIGTRAP"
    default: return "signal \(signal)"
    }
}

/// Which output stream of a child a line came from.
public enum OutputStream: String, Sendable {
    case stdout, stderr
}

/// Receives what a `ChildProcess` does (on the loop thread).
public protocol ChildProcessDelegate: AnyObject {
    /// A complete line (without its newline; a last line without one is reported at end of stream, and an overlong
    /// one is cut into pieces of `ChildProcess.maxLineLength` bytes). Invalid UTF-8 is repaired.
    func childProcess(_ child: ChildProcess, wrote line: String, to stream: OutputStream)
    /// The process ended (reaped by libuv). Called exactly once per started process. Lines it wrote before ending
    /// may still arrive after this call (the pipes are read until end of stream).
    func childProcess(_ child: ChildProcess, exited: ProcessExit)
}

/// A child process started with `uv_spawn`, its stdin on `/dev/null` and its stdout and stderr on pipes that are
/// read line by line.
///
/// Handle lifecycle: `spawn` inits the `uv_process_t` handle (which retains this object) and two `uv_pipe_t`
/// handles (`OutputPipe`, which retain themselves); when `uv_spawn` fails all three are closed at once and
/// `spawn` throws. After a successful start the process handle is closed right after libuv reports the exit (the
/// delegate hears `exited` first); each pipe closes itself at end of stream or on a read error. `close()` closes
/// the pipes early (a grandchild may hold them open); it never kills anything. Memory is freed in the close
/// callbacks only.
public final class ChildProcess: HandleOwner {
    /// Longest line delivered in one piece, in bytes.
    public static let maxLineLength = 16_384

    /// The process id (valid from a successful `spawn` on; the kernel may reuse it once `exited` was reported).
    public private(set) var pid: Int32 = 0
    /// Whether the child leads a process group of its own (spawned detached, so `setsid`).
    public private(set) var leadsProcessGroup = false
    /// Who hears lines and the exit. Held strongly until the exit was reported and both pipes closed.
    public var delegate: (any ChildProcessDelegate)?
    /// How it ended, once it did.
    public private(set) var exit: ProcessExit?
    private var pipes: [OutputPipe] = []

    private init(loop: EventLoop) {
        super.init(loop: loop, handleType: uv_process_t.self)
    }

    /// Starts a process. Throws `TransportError.uv` when it cannot be started (for example `ENOENT`: no such
    /// executable, `EACCES`: not executable, or the working directory does not exist); nothing is left open then.
    public static func spawn(loop: EventLoop, options: SpawnOptions,
                             delegate: any ChildProcessDelegate) throws(TransportError) -> ChildProcess {
        let child = ChildProcess(loop: loop)
        child.delegate = delegate
        let out = OutputPipe(loop: loop, stream: .stdout)
        let err = OutputPipe(loop: loop, stream: .stderr)
        let rc = child.start(options: options, stdout: out, stderr: err)
        if rc < 0 {
            out.closeHandle()
            err.closeHandle()
            child.delegate = nil
            child.closeHandle()
            throw .uv(UVError(code: rc, operation: "uv_spawn \(options.executable)"))
        }
        child.pipes = [out, err]
        for pipe in child.pipes {
            pipe.owner = child
            pipe.startReading()
        }
        return child
    }

    /// Unblocks SIGCHLD on the calling thread and restores its default action. libuv learns of child exits through
    /// SIGCHLD; a process started with it blocked or ignored (Foundation's `Process` may pass such a mask on)
    /// would never hear that a child ended. Call once at startup, on the main thread, before creating threads.
    public static func prepareSignals() {
        _ = Glibc.signal(SIGCHLD, SIG_DFL)
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGCHLD)
        let rc = pthread_sigmask(SIG_UNBLOCK, &set, nil)
        precondition(rc == 0, "pthread_sigmask: \(rc)")
    }

    /// Whether the process is known to be running (started and not yet reaped).
    public var isRunning: Bool { exit == nil && !closeStarted }

    /// Sends `signal` to the process — to its whole process group when it leads one, so that a worker that is a
    /// shell script takes its own children down with it instead of leaving them orphaned. Does nothing once it
    /// was reaped (the pid may be reused). Returns false when the kernel refused (e.g. `ESRCH` during the exit race).
    @discardableResult
    public func kill(_ signal: Int32) -> Bool {
        guard isRunning else { return false }
        if leadsProcessGroup && Glibc.kill(-pid, signal) == 0 { return true }
        return uv_process_kill(typed(uv_process_t.self), signal) == 0
    }

    /// Stops reading the output pipes and closes them (for shutdown: a grandchild may keep them open). Idempotent.
    public func close() {
        for pipe in pipes { pipe.closeHandle() }
    }

    // MARK: - Internal

    private func start(options: SpawnOptions, stdout: OutputPipe, stderr: OutputPipe) -> Int32 {
        let argv = [options.executable] + options.arguments
        return withCStrings(argv) { argv in
            withCStrings(options.environment) { env in
                withOptionalCString(options.workingDirectory) { cwd in
                    var stdio = [uv_stdio_container_t](repeating: uv_stdio_container_t(), count: 3)
                    stdio[0].flags = UV_IGNORE
                    stdio[1].flags = uv_stdio_flags(UV_CREATE_PIPE.rawValue | UV_WRITABLE_PIPE.rawValue)
                    stdio[1].data.stream = stdout.stream
                    stdio[2].flags = uv_stdio_flags(UV_CREATE_PIPE.rawValue | UV_WRITABLE_PIPE.rawValue)
                    stdio[2].data.stream = stderr.stream
                    return stdio.withUnsafeMutableBufferPointer { stdio in
                        var uvOptions = uv_process_options_t()
                        uvOptions.exit_cb = childProcessExited
                        uvOptions.file = argv[0].map { UnsafePointer($0) }
                        uvOptions.args = argv.baseAddress
                        uvOptions.env = env.baseAddress
                        uvOptions.cwd = cwd
                        uvOptions.flags = options.detached ? UInt32(UV_PROCESS_DETACHED.rawValue) : 0
                        uvOptions.stdio_count = 3
                        uvOptions.stdio = stdio.baseAddress
                        // The handle is initialised by uv_spawn even when it fails: adopt it either way, so that
                        // closing it frees the memory in the close callback.
                        let process = typed(uv_process_t.self)
                        let rc = uv_spawn(eventLoop.loop, process, &uvOptions)
                        adopt()
                        if rc == 0 {
                            pid = process.pointee.pid
                            leadsProcessGroup = options.detached
                        }
                        return rc
                    }
                }
            }
        }
    }

    fileprivate func exited(status: Int64, signal: Int32) {
        let how: ProcessExit = signal != 0 ? .signalled(signal) : .exited(Int32(truncatingIfNeeded: status))
        exit = how
        closeHandle()
        delegate?.childProcess(self, exited: how)
        releaseDelegateIfDone()
    }

    fileprivate func pipe(_ pipe: OutputPipe, wrote line: String) {
        delegate?.childProcess(self, wrote: line, to: pipe.kind)
    }

    fileprivate func pipeClosed(_ pipe: OutputPipe) {
        pipes.removeAll { $0 === pipe }
        releaseDelegateIfDone()
    }

    private func releaseDelegateIfDone() {
        if exit != nil && pipes.isEmpty { delegate = nil }
    }

    override func didClose() {
        if exit == nil { close() } // spawn failed, or closed by loop teardown
    }
}

/// One output pipe of a child (`uv_pipe_t`), read into lines.
///
/// Handle lifecycle: inited in `init` (the handle retains this object); `uv_spawn` connects it to the child;
/// reading starts after a successful spawn; it closes itself at end of stream or on a read error, or when its
/// `ChildProcess` is closed; the close callback frees the memory and tells the owner.
final class OutputPipe: HandleOwner {
    let kind: OutputStream
    /// The child; nil before a successful spawn and after the close callback.
    var owner: ChildProcess?
    private var partial: [UInt8] = []

    init(loop: EventLoop, stream: OutputStream) {
        kind = stream
        super.init(loop: loop, handleType: uv_pipe_t.self)
        uvMust(uv_pipe_init(loop.loop, typed(uv_pipe_t.self), 0), "uv_pipe_init")
        adopt()
    }

    var stream: UnsafeMutablePointer<uv_stream_t> { UnsafeMutablePointer(OpaquePointer(handle)) }

    func startReading() {
        let rc = uv_read_start(stream, connectionAllocShared, { stream, nread, buf in
            let pipe = Unmanaged<OutputPipe>.fromOpaque(stream!.pointee.data).takeUnretainedValue()
            let start = EventLoop.clock()  // every callback the loop runs counts towards its longest hold
            defer { pipe.eventLoop.holdEnded(since: start) }
            if nread > 0 {
                pipe.received(UnsafeRawBufferPointer(start: buf!.pointee.base, count: nread))
            } else if nread < 0 {
                pipe.flushPartial()
                pipe.closeHandle()
            }
        })
        if rc < 0 { closeHandle() }
    }

    private func received(_ bytes: UnsafeRawBufferPointer) {
        var start = 0
        for (i, byte) in bytes.enumerated() where byte == UInt8(ascii: "\n") {
            partial.append(contentsOf: bytes[start..<i])
            deliver()
            start = i + 1
        }
        partial.append(contentsOf: bytes[start...])
        while partial.count >= ChildProcess.maxLineLength {
            let rest = Array(partial[ChildProcess.maxLineLength...])
            partial.removeSubrange(ChildProcess.maxLineLength...)
            deliver()
            partial = rest
        }
    }

    private func flushPartial() {
        if !partial.isEmpty { deliver() }
    }

    private func deliver() {
        if partial.last == UInt8(ascii: "\r") { partial.removeLast() }
        let line = String(decoding: partial, as: UTF8.self)
        partial.removeAll(keepingCapacity: true)
        owner?.pipe(self, wrote: line)
    }

    override func didClose() {
        let owner = self.owner
        self.owner = nil
        owner?.pipeClosed(self)
    }
}

private func childProcessExited(_ process: UnsafeMutablePointer<uv_process_t>?, _ status: Int64, _ signal: Int32) {
    let child = Unmanaged<ChildProcess>.fromOpaque(process!.pointee.data).takeUnretainedValue()
    let start = EventLoop.clock()  // every callback the loop runs counts towards its longest hold
    child.exited(status: status, signal: signal)
    child.eventLoop.holdEnded(since: start)
}

/// The loop's shared read buffer (see `EventLoop.init`): every read is consumed before the next alloc.
private func connectionAllocShared(_ handle: UnsafeMutablePointer<uv_handle_t>?, _ suggested: Int,
                                   _ buf: UnsafeMutablePointer<uv_buf_t>?) {
    let base = handle!.pointee.loop.pointee.data!.assumingMemoryBound(to: CChar.self)
    buf!.pointee = uv_buf_init(base, UInt32(EventLoop.readBufferSize))
}

/// Calls `body` with a NULL-terminated `char*` array of `strings` (valid only during the call).
private func withCStrings<R>(_ strings: [String], _ body: (UnsafeMutableBufferPointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var pointers: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    pointers.append(nil)
    defer { for pointer in pointers { free(pointer) } }
    return pointers.withUnsafeMutableBufferPointer { body($0) }
}

private func withOptionalCString<R>(_ string: String?, _ body: (UnsafePointer<CChar>?) -> R) -> R {
    guard let string else { return body(nil) }
    return string.withCString { body($0) }
}
