import Glibc

/// Process-wide signal settings a daemon built on this transport needs; call once at startup, on the main
/// thread, before creating threads.
public enum ProcessSetup {
    /// Ignores SIGPIPE (libuv writes with plain `write(2)`: a peer that closes with writes pending would otherwise
    /// kill the process) and unblocks SIGINT, SIGTERM and SIGHUP on the calling thread: a process started by
    /// Foundation's `Process` from a thread that blocks them would otherwise inherit the mask and never see them.
    public static func prepareSignals() {
        _ = Glibc.signal(SIGPIPE, SIG_IGN)
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGINT)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGHUP)
        let rc = pthread_sigmask(SIG_UNBLOCK, &set, nil)
        precondition(rc == 0, "pthread_sigmask: \(rc)")
    }
}
