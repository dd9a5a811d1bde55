import FluxCore
import FluxJournal

// The lookup tables of the hot path, with their caches behind named types: routes by action type, peers by id.

/// Which registered stores handle an action type (SPEC §5: exact types and `prefix*` patterns), sorted by name
/// (the order of a settlement's results), with the caches the hot path needs: the route of every type looked up
/// since the last registration change (bounded), and the last route with its type as the dispatcher wrote it —
/// consecutive actions mostly have the same type written the same way, which then costs no decoding or hashing.
/// The stores one action type is routed to, and their names as its journal record holds them (encoded once per
/// route, not per dispatch: issue 27).
final class Route {
    /// Sorted by name.
    let stores: [StoreEntry]
    let journalNames: JournalNameList

    init(_ stores: [StoreEntry]) {
        self.stores = stores
        journalNames = JournalNameList(stores.map(\.name))
    }
}

struct RouteTable {
    private var routes: [String: Route] = [:]
    /// Every registered store's patterns, indexed: a type not cached costs lookups in proportion to its length,
    /// not a match against every pattern on the bus.
    private var index = PatternIndex()
    /// The route looked up last, with its type's JSON token (empty: none).
    private var lastType = ""
    private(set) var lastTypeJSON: [UInt8] = []
    private var lastRoute = Route([])
    private var lastTargets: [StoreEntry] = []

    /// How many action types' routes are cached before the cache starts over (a peer dispatching endless distinct
    /// types must not grow fluxd's memory).
    static let limit = 4096

    /// The last route looked up, when `typeJSON` is its type written byte for byte the same way; the caller then
    /// needs neither to decode nor to validate the type (it was valid).
    /// (`mutating` only so that the table is read in place: called as a non-mutating method on the router's
    /// stored table, it was copied whole and destroyed again per dispatch, ~500 instructions.)
    @inline(__always)
    mutating func last(ifSameAs typeJSON: ArraySlice<UInt8>) -> (type: String, targets: [StoreEntry])? {
        guard !lastTypeJSON.isEmpty, sameBytes(lastTypeJSON, typeJSON) else { return nil }
        return (lastType, lastTargets)
    }

    /// The journal's names of the last route's stores (read by a durable router only: the route object itself
    /// stays off an ephemeral dispatch's path).
    var lastJournalNames: JournalNameList { lastRoute.journalNames }

    /// The stores among `stores` that handle `type` (registered ones, up or down), sorted by name.
    mutating func targets(for type: String, typeJSON: ArraySlice<UInt8>, in stores: [String: StoreEntry]) -> [StoreEntry] {
        if !lastTypeJSON.isEmpty && lastType == type { return lastTargets }
        let route: Route
        if let cached = routes[type] {
            route = cached
        } else {
            route = Route(index.matching(type))
            if routes.count >= RouteTable.limit { routes.removeAll(keepingCapacity: true) }
            routes[type] = route
        }
        lastType = type
        lastTypeJSON = Array(typeJSON)
        lastRoute = route
        lastTargets = route.stores
        return route.stores
    }

    /// A registered store's patterns changed from `old` to `new` (`old` empty for a first registration).
    mutating func reindex(_ store: StoreEntry, old: [String], new: [String]) {
        guard old != new else { return }
        index.remove(store, old)
        index.add(store, new)
    }

    /// A registration changed: every route may have.
    mutating func invalidate() {
        routes.removeAll(keepingCapacity: true)
        lastType = ""
        lastTypeJSON = []
        lastRoute = Route([])
        lastTargets = []
    }
}

/// The connected peers by id, with the cache the hot path needs: frames come in runs from one connection, so the
/// peer of the last frame is kept and found again without hashing.
struct PeerTable {
    private(set) var byID: [PeerID: Peer] = [:]
    /// The peers of the last two frames, newest first: a reply and its request alternate between two peers (a
    /// client and a store at one action in flight), where a one-entry cache missed every time and each miss hashed
    /// into the table (~130 instructions; issue 27).
    private var last: Peer?
    private var previous: Peer?

    /// The connected peer `id`, through the two-entry cache (for the peer of an incoming frame).
    @inline(__always)
    mutating func cached(_ id: PeerID) -> Peer? {
        if let p = last, p.id == id { return p }
        if let p = previous, p.id == id {
            swap(&last, &previous)
            return p
        }
        guard let p = byID[id] else { return nil }
        previous = last
        last = p
        return p
    }

    /// The connected peer `id`.
    subscript(id: PeerID) -> Peer? { byID[id] }

    mutating func insert(_ peer: Peer) { byID[peer.id] = peer }

    /// Removes the peer `id` (and forgets it in the cache); nil if it was not connected.
    mutating func remove(_ id: PeerID) -> Peer? {
        if last?.id == id { last = nil }
        if previous?.id == id { previous = nil }
        return byID.removeValue(forKey: id)
    }

    var count: Int { byID.count }
    var isEmpty: Bool { byID.isEmpty }
    var values: Dictionary<PeerID, Peer>.Values { byID.values }
    /// Peer ids in connection order.
    var sortedIDs: [PeerID] { byID.keys.sorted() }
}

/// The patterns of registered stores (SPEC §5: an exact type, or a prefix ending in `*`), for the stores that
/// handle a type: exact ones by the type, prefix ones by the type's prefixes of the lengths some pattern has (at
/// most 256 look-ups, each of at most 256 bytes), so the work is bounded by the type, not by the bus.
struct PatternIndex {
    private var exact: [String: [StoreEntry]] = [:]
    private var prefixes: [[UInt8]: [StoreEntry]] = [:]
    /// How many prefixes of each length (in bytes) are indexed.
    private var lengths: [Int: Int] = [:]
    /// The lengths in use, sorted (rebuilt when one appears or goes).
    private var sortedLengths: [Int] = []

    mutating func add(_ store: StoreEntry, _ patterns: [String]) {
        for pattern in patterns {
            if pattern.utf8.last == UInt8(ascii: "*") {
                let prefix = Array(pattern.utf8.dropLast())
                prefixes[prefix, default: []].append(store)
                lengths[prefix.count, default: 0] += 1
                if lengths[prefix.count] == 1 { sortedLengths = lengths.keys.sorted() }
            } else {
                exact[pattern, default: []].append(store)
            }
        }
    }

    mutating func remove(_ store: StoreEntry, _ patterns: [String]) {
        for pattern in patterns {
            if pattern.utf8.last == UInt8(ascii: "*") {
                let prefix = Array(pattern.utf8.dropLast())
                guard var list = prefixes[prefix], let i = list.firstIndex(where: { $0 === store }) else { continue }
                list.remove(at: i)
                prefixes[prefix] = list.isEmpty ? nil : list
                let n = (lengths[prefix.count] ?? 1) - 1
                lengths[prefix.count] = n > 0 ? n : nil
                if n == 0 { sortedLengths = lengths.keys.sorted() }
            } else {
                guard var list = exact[pattern], let i = list.firstIndex(where: { $0 === store }) else { continue }
                list.remove(at: i)
                exact[pattern] = list.isEmpty ? nil : list
            }
        }
    }

    /// The stores with a pattern `type` matches, each once, sorted by name.
    func matching(_ type: String) -> [StoreEntry] {
        var found = exact[type] ?? []
        let bytes = Array(type.utf8)
        for n in sortedLengths {
            guard n <= bytes.count else { break }
            if let stores = prefixes[Array(bytes[..<n])] { found += stores }
        }
        if found.count > 1 {
            var seen = Set<ObjectIdentifier>()
            found = found.filter { seen.insert(ObjectIdentifier($0)).inserted }
            found.sort { $0.name < $1.name }
        }
        return found
    }
}
