import Foundation

/// Small process helpers shared by the examples' executables: unbuffered stdout/stderr writes (so ready lines
/// and renders are seen at once through pipes), ANSI styling, TTY detection and stop signals.
public enum Console {
    /// Writes `text` to stdout at once (no stdio buffering).
    public static func out(_ text: String) {
        FileHandle.standardOutput.write(Data(text.utf8))
    }

    /// Writes `text` to stderr at once.
    public static func err(_ text: String) {
        FileHandle.standardError.write(Data(text.utf8))
    }

    /// Whether stdout is a terminal (then views clear the screen; otherwise they print one render after another).
    public static var stdoutIsTTY: Bool { isatty(STDOUT_FILENO) == 1 }

    /// ANSI: clear the screen and move the cursor home.
    public static let clearScreen = "\u{1B}[2J\u{1B}[H"

    /// `text` in red when `enabled` (ANSI), else unchanged.
    public static func red(_ text: String, enabled: Bool) -> String {
        enabled ? "\u{1B}[31m\(text)\u{1B}[0m" : text
    }

    /// `text` dimmed when `enabled` (ANSI), else unchanged.
    public static func dim(_ text: String, enabled: Bool) -> String {
        enabled ? "\u{1B}[2m\(text)\u{1B}[0m" : text
    }

    /// Calls `handler` (on a private queue) when SIGINT or SIGTERM arrives, instead of dying. Keep the returned
    /// value alive for as long as the handler should stay installed.
    public static func onStopSignal(_ handler: @escaping @Sendable (Int32) -> Void) -> StopSignals {
        StopSignals(handler)
    }

    /// Lines read from stdin on a dedicated thread (a blocking `readLine` never ties up the concurrency pool).
    /// The stream finishes at end of input.
    public static func stdinLines() -> AsyncStream<String> {
        let (stream, continuation) = AsyncStream.makeStream(of: String.self)
        let thread = Thread {
            while let line = readLine(strippingNewline: true) { continuation.yield(line) }
            continuation.finish()
        }
        thread.start()
        return stream
    }
}

/// Installed SIGINT/SIGTERM handlers (see `Console.onStopSignal`).
public final class StopSignals {
    private let sources: [any DispatchSourceSignal]

    init(_ handler: @escaping @Sendable (Int32) -> Void) {
        // A process started by Foundation's `Process` from a test thread can inherit SIGINT/SIGTERM blocked
        // (sigprocmask is inherited across fork/exec): unblock them, or the stop request stays pending forever and never reaches the handler.
        var unblock = sigset_t()
        sigemptyset(&unblock)
        sigaddset(&unblock, SIGINT)
        sigaddset(&unblock, SIGTERM)
        pthread_sigmask(SIG_UNBLOCK, &unblock, nil)
        let queue = DispatchQueue(label: "stop-signals")
        sources = [SIGINT, SIGTERM].map { signo in
            signal(signo, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signo, queue: queue)
            source.setEventHandler { handler(signo) }
            source.resume()
            return source
        }
    }

    deinit {
        for source in sources { source.cancel() }
    }
}
