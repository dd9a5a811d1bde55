import CommentsModel
import FluxClient
import Foundation

/// What comments-view shows for one site: its comments as threads, "loading…", or the fetch error.
///
/// Same conventions as todo-view: on a terminal each render clears the screen; otherwise each render is printed
/// after a `--- version N ---` line (N = the `comments` store's version) and error lines are printed in place.
actor CommentsScreen {
    /// What a render concluded about the site, for `--once-loaded`.
    enum Outcome: Sendable, Equatable {
        /// Not decided yet (loading, or the store has not seen our query yet).
        case pending
        /// Loaded while our query is active.
        case loaded
        /// The fetch failed while our query is active.
        case failed
    }

    private let site: Int
    private let tty: Bool
    private var snapshot: Snapshot<CommentsState>?
    private var status = "connecting"
    private var lastError: String?
    private var lastRender: String?
    private var rendered = 0

    init(site: Int, tty: Bool) {
        self.site = site
        self.tty = tty
    }

    /// Handles one subscription event; returns what the site's state now says.
    func event(_ event: StoreEvent<CommentsState>) -> Outcome {
        switch event {
        case .subscribed(let s):
            status = s.rawValue
            if s == .up { return .pending } // The retained snapshot follows at once.
        case .snapshot(let s):
            snapshot = s
        case .storeDown(let reason):
            status = "down (\(reason))"
        case .storeUp:
            status = "up"
        }
        render()
        rendered = snapshot?.version ?? 0
        return outcome
    }

    /// Loaded or failed, once the store has taken our query into account (`activeSites` lists the site), so a
    /// stale error or an old cache from before the query does not decide.
    var outcome: Outcome {
        guard status == "up", let state = snapshot?.state, state.activeSites.contains(site) else { return .pending }
        switch state.phase(site: site) {
        case .loaded: return .loaded
        case .failed: return .failed
        case .idle, .loading: return .pending
        }
    }

    /// Shows an error line (red on a terminal).
    func error(_ text: String) {
        let line = "error: \(text)"
        if tty {
            lastError = line
            lastRender = nil
            render()
        } else {
            Console.out(line + "\n")
        }
    }

    /// Forgets the error shown at the bottom of the terminal screen.
    func clearError() {
        guard tty, lastError != nil else { return }
        lastError = nil
        lastRender = nil
        render()
    }

    /// Whether the snapshot at (at least) this version has been rendered.
    func hasRendered(_ version: Int) -> Bool { rendered >= version }

    private func render() {
        let body = Self.body(site: site, snapshot: snapshot, status: status, color: tty)
        guard body != lastRender else { return }
        lastRender = body
        if tty {
            var screen = Console.clearScreen + body
            if let lastError { screen += Console.red(lastError, enabled: true) + "\n" }
            screen += Console.dim("commands: reply PARENT TEXT (0 = new thread) | delete ID | refresh | quit", enabled: true)
            screen += "\n> "
            Console.out(screen)
        } else {
            Console.out("--- version \(snapshot?.version ?? 0) ---\n" + body)
        }
    }

    /// The text of one render.
    static func body(site: Int, snapshot: Snapshot<CommentsState>?, status: String, color: Bool) -> String {
        guard let snapshot else {
            return "site \(site): waiting for the comments store (\(status == "unknown" ? "not registered" : status))\n"
        }
        let state = snapshot.state
        var out = "comments of site \(site) (version \(snapshot.version); active sites: "
        out += state.activeSites.isEmpty ? "none" : state.activeSites.map(String.init).joined(separator: ", ")
        out += ")"
        if status != "up" { out += " [store \(status)]" }
        out += "\n"
        switch state.phase(site: site) {
        case .idle:
            out += "  waiting for the store to take the query…\n"
        case .loading:
            if let cached = state.comments(site: site) { out += thread(cached) }
            out += "  loading…\n"
        case .failed(let message):
            if let cached = state.comments(site: site) { out += thread(cached) }
            out += Console.red("  error: \(message)", enabled: color) + "\n"
        case .loaded(let comments):
            out += comments.isEmpty ? "  (no comments)\n" : thread(comments)
        }
        return out
    }

    /// Comments as threads: each reply indented under its parent; orphans shown at the top level.
    static func thread(_ comments: [Comment]) -> String {
        let ids = Set(comments.map(\.id))
        var children: [Int: [Comment]] = [:]
        for c in comments { children[ids.contains(c.parent) ? c.parent : 0, default: []].append(c) }
        var out = ""
        var seen = Set<Int>()
        func walk(_ parent: Int, depth: Int) {
            for c in children[parent] ?? [] where seen.insert(c.id).inserted {
                out += String(repeating: "  ", count: depth + 1) + "#\(c.id) \(c.content)\n"
                walk(c.id, depth: depth + 1)
            }
        }
        walk(0, depth: 0)
        return out
    }
}
