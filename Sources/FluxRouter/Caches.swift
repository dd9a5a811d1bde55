import FluxCore

// The lookup tables of the hot path, with their caches behind named types: routes by action type, peers by id.

/// Which registered stores handle an action type (SPEC §5: exact types and `prefix*` patterns), sorted by name
/// (the order of a settlement's results), with the caches the hot path needs: the route of every type looked up
/// since the last registration change (bounded), and the last route with its type as the dispatcher wrote it —
/// consecutive actions mostly have the same type written the same way, which then costs no decoding or hashing.
struct RouteTable {
    private var routes: [String: [StoreEntry]] = [:]
    /// The route looked up last, with its type's JSON token (empty: none).
    private var lastType = ""
    private(set) var lastTypeJSON: [UInt8] = []
    private var lastTargets: [StoreEntry] = []

    /// How many action types' routes are cached before the cache starts over (a peer dispatching endless distinct
    /// types must not grow fluxd's memory).
    static let limit = 4096

    /// The last route looked up, when `typeJSON` is its type written byte for byte the same way; the caller then
    /// needs neither to decode nor to validate the type (it was valid).
    @inline(__always)
    func last(ifSameAs typeJSON: ArraySlice<UInt8>) -> (type: String, targets: [StoreEntry])? {
        guard !lastTypeJSON.isEmpty, sameBytes(lastTypeJSON, typeJSON) else { return nil }
        return (lastType, lastTargets)
    }

    /// The stores among `stores` that handle `type` (registered ones, up or down), sorted by name.
    mutating func targets(for type: String, typeJSON: ArraySlice<UInt8>, in stores: [String: StoreEntry]) -> [StoreEntry] {
        if !lastTypeJSON.isEmpty && lastType == type { return lastTargets }
        let targets: [StoreEntry]
        if let cached = routes[type] {
            targets = cached
        } else {
            var found: [StoreEntry] = []
            for store in stores.values where store.wasRegistered {
                if store.handles.contains(where: { Names.matches(pattern: $0, type: type) }) { found.append(store) }
            }
            found.sort { $0.name < $1.name }
            if routes.count >= RouteTable.limit { routes.removeAll(keepingCapacity: true) }
            routes[type] = found
            targets = found
        }
        lastType = type
        lastTypeJSON = Array(typeJSON)
        lastTargets = targets
        return targets
    }

    /// A registration changed: every route may have.
    mutating func invalidate() {
        routes.removeAll(keepingCapacity: true)
        lastType = ""
        lastTypeJSON = []
        lastTargets = []
    }
}

/// The connected peers by id, with the cache the hot path needs: frames come in runs from one connection, so the
/// peer of the last frame is kept and found again without hashing.
struct PeerTable {
    private(set) var byID: [PeerID: Peer] = [:]
    private var last: Peer?

    /// The connected peer `id`, through the one-entry cache (for the peer of an incoming frame).
    @inline(__always)
    mutating func cached(_ id: PeerID) -> Peer? {
        if let p = last, p.id == id { return p }
        guard let p = byID[id] else { return nil }
        last = p
        return p
    }

    /// The connected peer `id`.
    subscript(id: PeerID) -> Peer? { byID[id] }

    mutating func insert(_ peer: Peer) { byID[peer.id] = peer }

    /// Removes the peer `id` (and forgets it in the cache); nil if it was not connected.
    mutating func remove(_ id: PeerID) -> Peer? {
        if last?.id == id { last = nil }
        return byID.removeValue(forKey: id)
    }

    var count: Int { byID.count }
    var isEmpty: Bool { byID.isEmpty }
    var values: Dictionary<PeerID, Peer>.Values { byID.values }
    /// Peer ids in connection order.
    var sortedIDs: [PeerID] { byID.keys.sorted() }
}
