import FluxJSONValue

// SPEC §16.4: a store's path subscriptions as a trie of pointer tokens, so a patch is matched against the paths it
// touches in O(operations · depth + what it touches), not operations × subscriptions. Tokens are compared by their
// bytes (SPEC §3.2: "\u00e9" and "e\u0301" are two tokens).
//
// What an operation at T touches (the definition is `Router.touches`, SPEC §16.4; the router tests hold the two
// together on random patches):
// - every subscription on the way down to T (a path that is a prefix of T: an ancestor changed inside);
// - every subscription at or below T (T is a prefix of the path: replaced, removed or changed inside);
// - when the operation inserts or removes (add, remove, copy's target, either side of move) and T's last token is
//   an array index i: every subscription below T's parent whose next token is an array index >= i (its element
//   moved).
// A patch's marks are collected first (per node: "all below", "subscriptions here", "indices from i on"), then
// each marked node is walked once, so a node touched by many operations is walked once per patch.

/// The path subscriptions of one store, indexed by their tokens.
final class PathIndex {
    final class Node {
        /// Subscriptions whose path ends here.
        var subs: [PathSubscription] = []
        /// Children by token (bytes), and those whose token is an array index, sorted by it.
        var children: [MemberKey: Node] = [:]
        var indexChildren: [(index: Int, node: Node)] = []
        /// Subscriptions here and below.
        var count = 0
        /// Marks of the patch being matched (`stamp`): all below collected; the subscriptions here collected; the
        /// smallest index from which children are touched.
        var allMark: UInt64 = 0
        var hereMark: UInt64 = 0
        var shiftMark: UInt64 = 0
        var shiftFrom = 0
    }

    private let root = Node()
    private var stamp: UInt64 = 0
    /// Every subscription, for a change that came as a whole state (in subscription order: `order`).
    private(set) var count = 0
    /// Node visits of the last `touched` (for the unit tests that count work).
    private(set) var lastSteps = 0

    var isEmpty: Bool { count == 0 }

    func insert(_ sub: PathSubscription) {
        var node = root
        node.count += 1
        for token in sub.tokens {
            let key = MemberKey(text: token)
            if let next = node.children[key] {
                node = next
            } else {
                let next = Node()
                node.children[key] = next
                if let index = JSONValue.arrayIndex(token) {
                    let at = Self.firstIndexChild(node, atLeast: index)
                    node.indexChildren.insert((index, next), at: at)
                }
                node = next
            }
            node.count += 1
        }
        node.subs.append(sub)
        count += 1
    }

    func remove(_ sub: PathSubscription) {
        var path: [Node] = [root]
        var node = root
        for token in sub.tokens {
            guard let next = node.children[MemberKey(text: token)] else { return }
            node = next
            path.append(node)
        }
        guard let i = node.subs.firstIndex(where: { $0 === sub }) else { return }
        node.subs.remove(at: i)
        count -= 1
        for n in path { n.count -= 1 }
        // Prune the nodes left empty, from the bottom.
        var k = sub.tokens.count
        while k > 0, path[k].count == 0 {
            let parent = path[k - 1], token = sub.tokens[k - 1]
            parent.children[MemberKey(text: token)] = nil
            if let index = JSONValue.arrayIndex(token) {
                let at = Self.firstIndexChild(parent, atLeast: index)
                if at < parent.indexChildren.count, parent.indexChildren[at].node === path[k] {
                    parent.indexChildren.remove(at: at)
                }
            }
            k -= 1
        }
    }

    func removeAll() {
        root.subs = []
        root.children = [:]
        root.indexChildren = []
        root.count = 0
        count = 0
    }

    /// Every subscription, in subscription order.
    var all: [PathSubscription] {
        var out: [PathSubscription] = []
        out.reserveCapacity(count)
        func walk(_ node: Node) {
            out.append(contentsOf: node.subs)
            for child in node.children.values { walk(child) }
        }
        walk(root)
        return out.sorted { $0.order < $1.order }
    }

    /// The subscriptions a patch's operations (as applied: `-` resolved to the index it made) touch, each once,
    /// in subscription order.
    func touched(by operations: [JSONPatchOperation]) -> [PathSubscription] {
        self.stamp &+= 1
        let stamp = self.stamp
        var steps = 0
        var marked: [Node] = []  // nodes with an "all below" or "indices from" mark, to walk at the end
        func markTarget(_ tokens: [String], shifts: Bool) {
            var node = root
            collectHere(node, &marked)
            steps += 1
            for (k, token) in tokens.enumerated() {
                if shifts, k == tokens.count - 1, let index = JSONValue.arrayIndex(token) {
                    if node.shiftMark != stamp {
                        node.shiftMark = stamp
                        node.shiftFrom = index
                        marked.append(node)
                    } else {
                        node.shiftFrom = min(node.shiftFrom, index)
                    }
                }
                guard let next = node.children[MemberKey(text: token)] else { return }
                node = next
                steps += 1
                collectHere(node, &marked)
            }
            if node.allMark != stamp {
                node.allMark = stamp
                marked.append(node)
            }
        }
        for operation in operations {
            switch operation {
            case .test: continue
            case .replace(let target, _): markTarget(target.tokens, shifts: false)
            case .add(let target, _), .remove(let target), .copy(_, let target): markTarget(target.tokens, shifts: true)
            case .move(let from, let target):
                markTarget(from.tokens, shifts: true)
                markTarget(target.tokens, shifts: true)
            }
        }
        // Walk each marked node once; a node already walked as part of an "all below" is skipped.
        var result: [PathSubscription] = []
        func collectAll(_ node: Node) {
            steps += 1
            if node.hereMark != stamp {
                node.hereMark = stamp
                for sub in node.subs where sub.touchMark != stamp { sub.touchMark = stamp; result.append(sub) }
            }
            for child in node.children.values where child.allMark != stamp {
                child.allMark = stamp
                collectAll(child)
            }
        }
        var walked = Set<ObjectIdentifier>()
        for node in marked {
            if node.allMark == stamp, walked.insert(ObjectIdentifier(node)).inserted {
                collectAll(node)
            }
            if node.shiftMark == stamp {
                var i = Self.firstIndexChild(node, atLeast: node.shiftFrom)
                while i < node.indexChildren.count {
                    let child = node.indexChildren[i].node
                    if child.allMark != stamp || !walked.contains(ObjectIdentifier(child)) {
                        child.allMark = stamp
                        walked.insert(ObjectIdentifier(child))
                        collectAll(child)
                    }
                    i += 1
                }
                node.shiftMark = 0
            }
        }
        // And the subscriptions at the nodes on the way down (ancestors of a target), collected as they were passed.
        result.append(contentsOf: pendingHere)
        pendingHere.removeAll(keepingCapacity: true)
        lastSteps = steps
        return result.sorted { $0.order < $1.order }
    }

    private var pendingHere: [PathSubscription] = []

    /// The subscriptions exactly at `node` (a path that is a prefix of an operation's target), once per patch.
    private func collectHere(_ node: Node, _ marked: inout [Node]) {
        guard node.hereMark != stamp else { return }
        node.hereMark = stamp
        for sub in node.subs where sub.touchMark != stamp {
            sub.touchMark = stamp
            pendingHere.append(sub)
        }
    }

    /// The position of the first index child whose index is at least `index` (binary search).
    private static func firstIndexChild(_ node: Node, atLeast index: Int) -> Int {
        var lo = 0, hi = node.indexChildren.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if node.indexChildren[mid].index < index { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }
}
