// The comments example's shared model (seed 001, WordPressFlux's CommentsStore): the `comments` store's state, its
// query, the actions and their type names, the pure reducer logic, and the fake remote API. Used by comments-store
// and comments-view (each its own process).

/// The names used by the comments example.
public enum CommentsStores {
    /// The query-driven store owning the comments (comments-store).
    public static let comments = "comments"
}

/// The action types of the comments example.
public enum CommentsActions {
    /// The pattern the comments store registers for.
    public static let all = "comments/*"
    /// A fetch of a site's comments began (`SiteRef`). Dispatched by the store's fetch itself; any client may
    /// dispatch it too, to refresh a site (the store then fetches it unless a fetch is already running).
    public static let fetchStarted = "comments/fetch-started"
    /// A fetch finished with the site's comments (`CommentsLoaded`).
    public static let loaded = "comments/loaded"
    /// A fetch failed (`CommentsFailed`).
    public static let failed = "comments/failed"
    /// A reply was posted (`ReplyToComment`).
    public static let reply = "comments/reply"
    /// A comment was deleted (`DeleteComment`).
    public static let delete = "comments/delete"
}

/// One comment of a site.
public struct Comment: Codable, Equatable, Sendable, Identifiable {
    /// Unique within its site.
    public var id: Int
    /// The site it belongs to.
    public var site: Int
    /// The comment it answers, or 0 for a top-level comment.
    public var parent: Int
    /// The text.
    public var content: String

    public init(id: Int, site: Int, parent: Int, content: String) {
        self.id = id
        self.site = site
        self.parent = parent
        self.content = content
    }
}

/// The full state of the `comments` store (WordPressFlux's `CommentsStoreState`, over the bus).
///
/// Dictionaries are keyed by the site id as a string (`"7"`), which is what a JSON object can hold; use the
/// `subscript(site:)`-style helpers to read them by `Int`.
public struct CommentsState: Codable, Equatable, Sendable {
    /// Loaded comments per site. A site without an entry has not been loaded.
    public var comments: [String: [Comment]]
    /// Whether a fetch of the site is running.
    public var fetching: [String: Bool]
    /// The error of the site's last fetch, if it failed (cleared when a fetch starts or succeeds).
    public var errors: [String: String]
    /// The sites of the currently active queries, ascending: what the clients want right now.
    public var activeSites: [Int]

    public init(comments: [String: [Comment]] = [:], fetching: [String: Bool] = [:], errors: [String: String] = [:],
                activeSites: [Int] = []) {
        self.comments = comments
        self.fetching = fetching
        self.errors = errors
        self.activeSites = activeSites
    }

    /// The dictionary key of a site.
    public static func key(_ site: Int) -> String { String(site) }

    /// The site's loaded comments, or nil when it has not been loaded.
    public func comments(site: Int) -> [Comment]? { comments[Self.key(site)] }

    /// Whether a fetch of the site is running.
    public func isFetching(site: Int) -> Bool { fetching[Self.key(site)] ?? false }

    /// The error of the site's last fetch, if it failed.
    public func error(site: Int) -> String? { errors[Self.key(site)] }

    /// What a view of `site` should show.
    public func phase(site: Int) -> SitePhase {
        if isFetching(site: site) { return .loading }
        if let error = error(site: site) { return .failed(error) }
        if let comments = comments(site: site) { return .loaded(comments) }
        return .idle
    }
}

/// How far a site's comments are, as a view sees it.
public enum SitePhase: Equatable, Sendable {
    /// Nothing asked yet (the store has not seen a query for it, or it is not running).
    case idle
    /// A fetch is running.
    case loading
    /// The last fetch failed with this error.
    case failed(String)
    /// Loaded.
    case loaded([Comment])
}

/// The query a view declares: "I need the comments of this site" (WordPressFlux's `CommentsQuery`).
public struct CommentsQuery: Codable, Equatable, Hashable, Sendable {
    /// The site wanted.
    public var site: Int
    public init(site: Int) { self.site = site }
}

/// Payload of `comments/fetch-started`.
public struct SiteRef: Codable, Equatable, Sendable {
    /// The site being fetched.
    public var site: Int
    public init(site: Int) { self.site = site }
}

/// Payload of `comments/loaded`.
public struct CommentsLoaded: Codable, Equatable, Sendable {
    /// The site fetched.
    public var site: Int
    /// All its comments.
    public var comments: [Comment]
    public init(site: Int, comments: [Comment]) {
        self.site = site
        self.comments = comments
    }
}

/// Payload of `comments/failed`.
public struct CommentsFailed: Codable, Equatable, Sendable {
    /// The site whose fetch failed.
    public var site: Int
    /// Why.
    public var error: String
    public init(site: Int, error: String) {
        self.site = site
        self.error = error
    }
}

/// Payload of `comments/reply`.
public struct ReplyToComment: Codable, Equatable, Sendable {
    /// The site.
    public var site: Int
    /// The comment answered (0 = a new top-level comment).
    public var parent: Int
    /// The text; must not be blank.
    public var content: String
    public init(site: Int, parent: Int, content: String) {
        self.site = site
        self.parent = parent
        self.content = content
    }
}

/// Payload of `comments/delete`.
public struct DeleteComment: Codable, Equatable, Sendable {
    /// The site.
    public var site: Int
    /// The comment to delete.
    public var id: Int
    public init(site: Int, id: Int) {
        self.site = site
        self.id = id
    }
}

/// Why the comments reducer refused an action: a stable code (the store's `reject` code) and a message.
public struct CommentsRejection: Error, Equatable, Sendable, CustomStringConvertible {
    /// `comments/not-found`: the site is not loaded, or the parent / comment id is not in it.
    public static let notFoundCode = "comments/not-found"
    /// `comments/empty`: a reply with blank content.
    public static let emptyCode = "comments/empty"

    /// The stable code.
    public var code: String
    /// Human-readable detail.
    public var message: String

    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
}

extension CommentsState {
    /// Records the active query set; returns the sites that just became active.
    public mutating func setActive(sites: [Int]) -> [Int] {
        let previous = Set(activeSites)
        activeSites = Array(Set(sites)).sorted()
        return activeSites.filter { !previous.contains($0) }
    }

    /// Marks a fetch of `site` as running (its previous error is forgotten).
    public mutating func startFetching(site: Int) {
        fetching[Self.key(site)] = true
        errors[Self.key(site)] = nil
    }

    /// `comments/loaded`.
    public mutating func loaded(site: Int, comments: [Comment]) {
        self.comments[Self.key(site)] = comments
        fetching[Self.key(site)] = false
        errors[Self.key(site)] = nil
    }

    /// `comments/failed`: the fetch ended with `error`; comments loaded before (if any) are kept.
    public mutating func failed(site: Int, error: String) {
        fetching[Self.key(site)] = false
        errors[Self.key(site)] = error
    }

    /// `comments/reply`: appends a comment with the site's next id. Parent 0 starts a new thread.
    @discardableResult
    public mutating func reply(site: Int, parent: Int, content: String) throws(CommentsRejection) -> Comment {
        let text = content.trimmingWhitespace()
        guard !text.isEmpty else { throw CommentsRejection(code: CommentsRejection.emptyCode, message: "the reply is blank") }
        guard var list = comments(site: site) else {
            throw CommentsRejection(code: CommentsRejection.notFoundCode, message: "site \(site) is not loaded")
        }
        guard parent == 0 || list.contains(where: { $0.id == parent }) else {
            throw CommentsRejection(code: CommentsRejection.notFoundCode, message: "no comment \(parent) on site \(site)")
        }
        let comment = Comment(id: (list.map(\.id).max() ?? 0) + 1, site: site, parent: parent, content: text)
        list.append(comment)
        comments[Self.key(site)] = list
        return comment
    }

    /// `comments/delete`.
    public mutating func delete(site: Int, id: Int) throws(CommentsRejection) {
        guard var list = comments(site: site), let index = list.firstIndex(where: { $0.id == id }) else {
            throw CommentsRejection(code: CommentsRejection.notFoundCode, message: "no comment \(id) on site \(site)")
        }
        list.remove(at: index)
        comments[Self.key(site)] = list
    }
}

/// The fake remote API the comments store "fetches" from: deterministic data per site.
public enum FakeCommentsAPI {
    /// The comments of `site`: three, "Comment N on site S"; the second answers the first.
    public static func comments(site: Int) -> [Comment] {
        [
            Comment(id: 1, site: site, parent: 0, content: "Comment 1 on site \(site)"),
            Comment(id: 2, site: site, parent: 1, content: "Comment 2 on site \(site)"),
            Comment(id: 3, site: site, parent: 0, content: "Comment 3 on site \(site)"),
        ]
    }
}

/// A small deterministic random generator (SplitMix64) for the simulated failures: same seed, same sequence.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension String {
    /// The string without leading and trailing spaces, tabs and newlines.
    func trimmingWhitespace() -> String {
        guard let first = firstIndex(where: { !$0.isWhitespace }), let last = lastIndex(where: { !$0.isWhitespace }) else {
            return ""
        }
        return String(self[first...last])
    }
}
