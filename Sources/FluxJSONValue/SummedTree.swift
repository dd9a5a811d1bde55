// A sequence kept as a B-tree whose nodes carry summaries (count, rendered bytes, height, largest seq): the arrays
// and the object member lists of `JSONTree`, fluxd's retained state (SPEC §16.5). Reading, replacing, inserting and
// removing at a position cost O(log n) node visits, each of at most `leafCapacity` items or `fanout` children,
// where an `Array` shifts every later element; the size and height of a whole subtree are read from its root in
// O(1), so a patch's size and depth are checked without walking what it made.
//
// Copy on write, node by node: copying a tree copies one reference; changing a shared tree copies only the nodes on
// the path to the change (each `isKnownUniquelyReferenced` before it is changed). So a JSON Patch `copy` shares the
// copied subtree, and a later change inside either copy costs the path, not the subtree.
//
// Why not swift-collections: its B-trees are not offered as stable products (`_RopeModule`'s Rope is underscored,
// `SortedCollections` needs the "unstable, not ready for production" trait), `OrderedDictionary` removes in O(n),
// and `Array` inserts in O(n) (issue 24: 22,000 keys into 176,000 took 31.6 s, 26,000 inserts at the front 4.9 s).
// `Tests/FluxJSONValueTests/JSONTreeTests.swift` holds this tree against `Array` on random operations, and the patch
// code built on it against `JSONValue.apply` (the reference implementation).

/// An item of a `SummedTree`: what it adds to its node's summary.
public protocol SummedItem {
    /// Bytes it takes when rendered (for a member: key, colon and value).
    var summedBytes: Int { get }
    /// Its nesting height (SPEC §3.2 levels: a scalar 0, a container 1 + its deepest item).
    var summedHeight: Int { get }
    /// Its position stamp, increasing along the sequence (object members: the order they were added); 0 if unused.
    var summedSeq: UInt64 { get }
}

/// What a subtree holds, in O(1).
public struct TreeSummary: Sendable, Equatable {
    public var count = 0
    /// Sum of the items' `summedBytes` (saturating: a patch that doubles a state is refused long before).
    public var bytes = 0
    /// Largest item height.
    public var height = 0
    /// Largest item seq.
    public var maxSeq: UInt64 = 0

    /// The ceiling sums saturate at.
    public static let saturated = 1 << 60

    @inline(__always)
    mutating func add<Item: SummedItem>(_ item: Item) {
        count += 1
        bytes = Self.sum(bytes, item.summedBytes)
        height = max(height, item.summedHeight)
        maxSeq = max(maxSeq, item.summedSeq)
    }

    @inline(__always)
    mutating func add(_ other: TreeSummary) {
        count += other.count
        bytes = Self.sum(bytes, other.bytes)
        height = max(height, other.height)
        maxSeq = max(maxSeq, other.maxSeq)
    }

    @inline(__always)
    static func sum(_ a: Int, _ b: Int) -> Int { min(a + b, saturated) }
}

/// A node: a leaf holds items, an inner node children (never both). Mutated only while uniquely referenced.
final class SummedNode<Item: SummedItem>: @unchecked Sendable {
    var items: [Item]
    var children: [SummedNode<Item>]
    var summary = TreeSummary()

    init(items: [Item]) {
        self.items = items
        self.children = []
        recount()
    }

    init(children: [SummedNode<Item>]) {
        self.items = []
        self.children = children
        recount()
    }

    var isLeaf: Bool { children.isEmpty }

    func copy() -> SummedNode<Item> {
        let node = isLeaf ? SummedNode(items: []) : SummedNode(children: [])
        node.items = items
        node.children = children
        node.summary = summary
        return node
    }

    /// Recomputes the summary from the items or children (O(node width)).
    func recount() {
        var s = TreeSummary()
        if children.isEmpty {
            for item in items { s.add(item) }
        } else {
            for child in children { s.add(child.summary) }
        }
        summary = s
    }
}

/// A sequence of items as a B-tree with summaries (see the file's comment). Value semantics, copy on write.
public struct SummedTree<Item: SummedItem>: @unchecked Sendable {
    /// Items per leaf, at most; children per inner node, at most.
    static var leafCapacity: Int { 64 }
    static var fanout: Int { 32 }

    var root: SummedNode<Item>

    /// An empty sequence.
    public init() { root = SummedNode(items: []) }

    /// The items in order, built bottom-up in O(n).
    public init(_ items: [Item]) {
        if items.count <= Self.leafCapacity {
            root = SummedNode(items: items)
            return
        }
        var level: [SummedNode<Item>] = []
        level.reserveCapacity(items.count / Self.leafCapacity + 1)
        var start = 0
        // Leaves three-quarters full, so inserts do not split them at once.
        let perLeaf = Self.leafCapacity * 3 / 4
        while start < items.count {
            let end = min(start + perLeaf, items.count)
            level.append(SummedNode(items: Array(items[start..<end])))
            start = end
        }
        let perNode = Self.fanout * 3 / 4
        while level.count > 1 {
            var next: [SummedNode<Item>] = []
            next.reserveCapacity(level.count / perNode + 1)
            var i = 0
            while i < level.count {
                let end = min(i + perNode, level.count)
                next.append(SummedNode(children: Array(level[i..<end])))
                i = end
            }
            level = next
        }
        root = level[0]
    }

    public var summary: TreeSummary { root.summary }
    public var count: Int { root.summary.count }
    public var isEmpty: Bool { root.summary.count == 0 }

    /// The item at `position` (0 ..< count).
    public subscript(position: Int) -> Item {
        var node = root
        var i = position
        while !node.isLeaf {
            let c = Self.child(node, containing: &i)
            node = node.children[c]
        }
        return node.items[i]
    }

    /// Calls `body` on every item in order.
    public func forEach(_ body: (Item) throws -> Void) rethrows {
        try Self.walk(root, body)
    }

    private static func walk(_ node: SummedNode<Item>, _ body: (Item) throws -> Void) rethrows {
        if node.isLeaf {
            for item in node.items { try body(item) }
        } else {
            for child in node.children { try walk(child, body) }
        }
    }

    /// The items in order, as an array.
    public var array: [Item] {
        var out: [Item] = []
        out.reserveCapacity(count)
        forEach { out.append($0) }
        return out
    }

    /// The position of the item whose seq is `seq` (seqs increase along the sequence), or nil.
    public func position(ofSeq seq: UInt64) -> Int? {
        var node = root
        var base = 0
        while !node.isLeaf {
            var c = 0
            while c < node.children.count, node.children[c].summary.maxSeq < seq {
                base += node.children[c].summary.count
                c += 1
            }
            guard c < node.children.count else { return nil }
            node = node.children[c]
        }
        // Binary search: items' seqs increase.
        var lo = 0, hi = node.items.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if node.items[mid].summedSeq < seq { lo = mid + 1 } else { hi = mid }
        }
        guard lo < node.items.count, node.items[lo].summedSeq == seq else { return nil }
        return base + lo
    }

    /// Runs `body` on the item at `position`, in place (copying only the shared nodes on the way), and updates the
    /// summaries on the path.
    public mutating func update<R, E: Error>(at position: Int, _ body: (inout Item) throws(E) -> R) throws(E) -> R {
        if !isKnownUniquelyReferenced(&root) { root = root.copy() }
        return try Self.update(root, position, body)
    }

    private static func update<R, E: Error>(_ node: SummedNode<Item>, _ position: Int,
                                            _ body: (inout Item) throws(E) -> R) throws(E) -> R {
        defer { node.recount() }
        if node.isLeaf { return try body(&node.items[position]) }
        var i = position
        let c = child(node, containing: &i)
        if !isKnownUniquelyReferenced(&node.children[c]) { node.children[c] = node.children[c].copy() }
        return try update(node.children[c], i, body)
    }

    /// The child of inner `node` that holds `position` (0 ..< its count); `position` becomes the offset in it.
    @inline(__always)
    static func child(_ node: SummedNode<Item>, containing position: inout Int) -> Int {
        var c = 0
        while position >= node.children[c].summary.count {
            position -= node.children[c].summary.count
            c += 1
        }
        return c
    }

    /// Inserts `item` at `position` (0 ... count).
    public mutating func insert(_ item: Item, at position: Int) {
        if !isKnownUniquelyReferenced(&root) { root = root.copy() }
        if let split = Self.insert(item, at: position, into: root) {
            root = SummedNode(children: [root, split])
        }
    }

    /// Appends `item`.
    public mutating func append(_ item: Item) { insert(item, at: count) }

    /// Inserts into `node`; returns the right half when the node had to split.
    private static func insert(_ item: Item, at position: Int, into node: SummedNode<Item>) -> SummedNode<Item>? {
        if node.isLeaf {
            node.items.insert(item, at: position)
            guard node.items.count > leafCapacity else {
                node.summary.add(item)
                return nil
            }
            let half = node.items.count / 2
            let right = SummedNode(items: Array(node.items[half...]))
            node.items.removeSubrange(half...)
            node.recount()
            return right
        }
        var i = position
        var c = 0
        while c < node.children.count - 1, i > node.children[c].summary.count {
            i -= node.children[c].summary.count
            c += 1
        }
        if !isKnownUniquelyReferenced(&node.children[c]) { node.children[c] = node.children[c].copy() }
        if let split = insert(item, at: i, into: node.children[c]) {
            node.children.insert(split, at: c + 1)
            if node.children.count > fanout {
                let half = node.children.count / 2
                let right = SummedNode(children: Array(node.children[half...]))
                node.children.removeSubrange(half...)
                node.recount()
                return right
            }
            node.recount()
        } else {
            node.summary.add(item)
            // (height and seq can only grow by an insert; bytes and count grew by the item's)
        }
        return nil
    }

    /// Removes and returns the item at `position` (0 ..< count).
    @discardableResult
    public mutating func remove(at position: Int) -> Item {
        if !isKnownUniquelyReferenced(&root) { root = root.copy() }
        let item = Self.remove(at: position, from: root)
        // A root with one child gives way to it; an inner root with none becomes an empty leaf.
        while !root.isLeaf, root.children.count <= 1 {
            root = root.children.first ?? SummedNode(items: [])
        }
        return item
    }

    private static func remove(at position: Int, from node: SummedNode<Item>) -> Item {
        if node.isLeaf {
            let item = node.items.remove(at: position)
            node.recount()
            return item
        }
        var i = position
        let c = child(node, containing: &i)
        if !isKnownUniquelyReferenced(&node.children[c]) { node.children[c] = node.children[c].copy() }
        let item = remove(at: i, from: node.children[c])
        if node.children[c].summary.count == 0 {
            node.children.remove(at: c)
        } else {
            mergeIfSmall(node, c)
        }
        node.recount()
        return item
    }

    /// Merges child `c` with a neighbour when it became small and both fit in one node (keeps nodes from thinning
    /// out under removals, so memory stays proportional to the items).
    private static func mergeIfSmall(_ node: SummedNode<Item>, _ c: Int) {
        let child = node.children[c]
        let width = child.isLeaf ? child.items.count : child.children.count
        let capacity = child.isLeaf ? leafCapacity : fanout
        guard width < capacity / 4 else { return }
        for n in [c - 1, c + 1] where n >= 0 && n < node.children.count {
            let other = node.children[n]
            guard other.isLeaf == child.isLeaf else { continue }
            let otherWidth = other.isLeaf ? other.items.count : other.children.count
            guard width + otherWidth <= capacity * 3 / 4 else { continue }
            let (left, right) = n < c ? (n, c) : (c, n)
            if !isKnownUniquelyReferenced(&node.children[left]) { node.children[left] = node.children[left].copy() }
            let l = node.children[left], r = node.children[right]
            if l.isLeaf { l.items.append(contentsOf: r.items) } else { l.children.append(contentsOf: r.children) }
            l.recount()
            node.children.remove(at: right)
            return
        }
    }

    /// How many levels of nodes (1 for a single leaf): for tests that count work.
    public var levels: Int {
        var n = 1
        var node = root
        while !node.isLeaf { node = node.children[0]; n += 1 }
        return n
    }
}
