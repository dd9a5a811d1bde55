import CommentsModel
import ExampleSupport
import FluxClient
import Foundation

/// What comments-view shows for one site: its comments as threads, "loading…", or the fetch error.
///
/// Renders go through `ScreenOutput`, like todo-view's (the N of `--- version N ---` is the `comments` store's
/// version).
actor CommentsScreen: ViewScreen {
    /// What a render concluded about the site, for `--once-loaded`.
    enum Outcome: Sendable, Equatable {
        /// Not decided yet (loading, or the store has not seen our query yet).
        case pending
        /// Loaded while our query is active.
        case loaded
        /// The fetch failed while our query is active.
        case failed
    }

    var output: ScreenOutput
    private let site: Int
    private var feed = StoreFeed<CommentsState>()
    private var rendered = 0

    init(site: Int, tty: Bool) {
        self.site = site
        output = ScreenOutput(tty: tty, commands: "commands: reply PARENT TEXT (0 = new thread) | delete ID | refresh | quit")
    }

    /// Handles one subscription event; returns what the site's state now says.
    func event(_ event: StoreEvent<CommentsState>) -> Outcome {
        guard feed.apply(event) else { return .pending }
        render()
        rendered = feed.version
        return outcome
    }

    /// Loaded or failed, once the store has taken our query into account (`activeSites` lists the site), so a
    /// stale error or an old cache from before the query does not decide.
    var outcome: Outcome {
        guard feed.status == "up", let state = feed.snapshot?.state, state.activeSites.contains(site) else { return .pending }
        switch state.phase(site: site) {
        case .loaded: return .loaded
        case .failed: return .failed
        case .idle, .loading: return .pending
        }
    }

    /// Whether the snapshot at (at least) this version has been rendered.
    func hasRendered(_ version: Int) -> Bool { rendered >= version }

    func render() {
        output.show(Self.body(site: site, snapshot: feed.snapshot, status: feed.status, color: output.tty), version: feed.version)
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
