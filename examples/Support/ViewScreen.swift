import FluxClient
import Foundation

/// How a view's renders reach stdout, and what it last showed.
///
/// On a terminal every render clears the screen and ends with the last error (red) and the dimmed commands line
/// and a prompt. Otherwise (a pipe, a test) each render is printed after a `--- version N ---` line, identical
/// consecutive renders are skipped, and error lines are printed where they happen.
public struct ScreenOutput: Sendable {
    /// Whether stdout is a terminal.
    public let tty: Bool
    /// The commands line shown under every render on a terminal.
    public let commands: String
    /// The error shown at the bottom of the terminal screen.
    var lastError: String?
    /// The body last printed (a render equal to it is skipped).
    var lastRender: String?
    /// Whether the loss of the connection has been reported.
    var lost = false

    public init(tty: Bool, commands: String) {
        self.tty = tty
        self.commands = commands
    }

    /// Prints one render of `body` (`version` is the N of the `--- version N ---` line), unless it is what was
    /// printed last.
    public mutating func show(_ body: String, version: Int) {
        guard body != lastRender else { return }
        lastRender = body
        if tty {
            var screen = Console.clearScreen + body
            if let lastError { screen += Console.red(lastError, enabled: true) + "\n" }
            screen += Console.dim(commands, enabled: true)
            screen += "\n> "
            Console.out(screen)
        } else {
            Console.out("--- version \(version) ---\n" + body)
        }
    }

    /// Prints `body` once, without the commands line or the check against the last render (for `--once`).
    public func showOnce(_ body: String, version: Int) {
        Console.out(tty ? body : "--- version \(version) ---\n" + body)
    }
}

/// A view's screen: an actor that keeps what it shows in a `ScreenOutput` and renders it with `render()`.
/// Error lines, notes and the loss of the connection are handled the same way by every view (this extension).
public protocol ViewScreen: Actor {
    /// Where renders go, and what was last shown.
    var output: ScreenOutput { get set }
    /// Renders the current state with `output.show(_:version:)` (or not, while there is nothing to show yet).
    func render()
}

extension ViewScreen {
    /// Shows an error line (red at the bottom of the screen on a terminal, printed in place otherwise).
    public func error(_ text: String) {
        let line = "error: \(text)"
        if output.tty {
            output.lastError = line
            output.lastRender = nil
            render()
        } else {
            Console.out(line + "\n")
        }
    }

    /// Shows an informational line.
    public func note(_ text: String) {
        if output.tty {
            output.lastError = nil
            output.lastRender = nil
            render()
        }
        Console.out(text + "\n")
    }

    /// Forgets the error shown at the bottom of the terminal screen (after a command that worked).
    public func clearError() {
        guard output.tty, output.lastError != nil else { return }
        output.lastError = nil
        output.lastRender = nil
        render()
    }

    /// Reports that the connection to fluxd is gone (once, whichever subscription noticed first) and exits 1.
    public func connectionLost(_ error: any Error) {
        guard !output.lost else { return }
        output.lost = true
        self.error("connection to fluxd lost: \(error)")
        exit(1)
    }
}

/// One subscription as a view shows it: the latest snapshot, the store's status (`connecting`, `up`, `unknown`,
/// `down (reason)` …), and whether its initial state has arrived.
public struct StoreFeed<State> {
    /// The latest snapshot, nil until the first one.
    public private(set) var snapshot: Snapshot<State>?
    /// The store's status as shown to the user.
    public private(set) var status = "connecting"
    /// Whether the subscription has delivered its initial state (a snapshot, or a status without one).
    public private(set) var settled = false

    public init() {}

    /// Takes one subscription event; returns whether it is worth a render (not for `subscribed` while the store is
    /// up: its retained snapshot follows at once).
    public mutating func apply(_ event: StoreEvent<State>) -> Bool {
        switch event {
        case .subscribed(let s):
            status = s.rawValue
            if s == .up { return false }
            settled = true
        case .snapshot(let s):
            snapshot = s
            settled = true
        case .storeDown(let reason):
            status = "down (\(reason))"
        case .storeUp:
            status = "up"
        }
        return true
    }

    /// The version of the latest snapshot (0 before the first).
    public var version: Int { snapshot?.version ?? 0 }
}

extension StoreFeed: Sendable where State: Sendable {}
