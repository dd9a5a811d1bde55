import FluxCore
import Foundation
import FluxJSONValue
import Testing
@testable import FluxRouter

/// Issue 24 on the router alone: the store-side surfaces (patches, path subscriptions) cost what the sender pays
/// for, counted in steps (never timed), and one store's patch never takes the budget from another user.
@Suite("Isolation on the store-side surfaces (patches, path subscriptions)")
struct StoreSideIsolationTests {
    /// A copy-bomb patch: `n` operations each copying the whole state into a new member (doubling it).
    static func bomb(_ n: Int) -> String {
        "[" + (0..<n).map { #"{"op":"copy","from":"","path":"/k\#($0)"}"# }.joined(separator: ",") + "]"
    }

    @Test("a 40-copy bomb is refused memory-budget at the operation that passes the store's room; nothing of it is kept, and another user is served")
    func copyBomb() {
        let bus = TestBus { c in
            c.memory.total = 64 << 20
            c.memory.perUser = 16 << 20
        }
        bus.store(1, "s", handles: ["s/*"], state: #"{"seed":"0123456789abcdef"}"#)
        _ = bus.take(1)
        let before = bus.router.patchSteps
        bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.bomb(40))}"#)
        let refusal = bus.take(1).last
        #expect(refusal?.str("code") == "memory-budget")
        #expect(refusal?.str("message")?.contains("patch operation") == true, "\(refusal?.str("message") ?? "")")
        #expect(bus.closedPeers.contains(1), "SPEC §16.2: a patched state over the budget closes the store's connection")
        // Work: a handful of node visits per operation (the copies are shared, the sizes read from summaries).
        #expect(bus.router.patchSteps - before < 40 * 30, "\(bus.router.patchSteps - before) steps")
        #expect(bus.router.memory.peak <= 64 << 20)
        // The retained state is as it was, and another user's client is welcomed and served.
        bus.feed(.connected(7, PeerCredentials(pid: 7, uid: 2000)))
        bus.send(7, #"{"op":"hello","protocol":1,"role":"client"}"#)
        #expect(bus.ops(7) == ["welcome"])
        bus.send(7, #"{"op":"get","store":"s"}"#)
        #expect(bus.take(7).last?.rawText("state") == #"{"seed":"0123456789abcdef"}"#)
    }

    @Test("a 16-copy patch that fits is charged at the full size it makes (copies included), and renders once")
    func copiesChargedInFull() {
        let bus = TestBus()
        bus.store(1, "s", handles: ["s/*"], state: #"{"seed":"0123456789abcdef"}"#)
        _ = bus.take(1)
        bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.bomb(16))}"#)
        #expect(!bus.closedPeers.contains(1))
        let store = bus.router.stores["s"]!
        let size = store.tree!.byteCount
        #expect(size > 27 << 16, "16 doublings of a 27-byte state")
        #expect(store.retainedCost == 96 + store.nameJSON.count + Router.treeOverhead * size)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"get","store":"s"}"#)
        #expect(bus.take(2).last?.raw("state")?.count == size)
    }

    @Test("a patch whose result would be deeper than 64 levels is refused from the summaries, without walking it")
    func deepCopyRefused() {
        let bus = TestBus()
        var deep = "1"
        for _ in 0..<60 { deep = "[\(deep)]" }
        bus.store(1, "s", handles: ["s/*"], state: #"{"d":\#(deep)}"#)
        _ = bus.take(1)
        let before = bus.router.patchSteps
        bus.send(1, #"{"op":"patch","store":"s","patch":[{"op":"copy","from":"/d","path":"/d/0/0/0/0/x"}]}"#)
        #expect(bus.take(1).last?.str("code") == "patch-failed")
        #expect(bus.router.patchSteps - before < 100)
    }

    @Test("keys that are canonically equivalent are different keys in fluxd's state (SPEC §3.2)")
    func equivalentKeys() {
        let bus = TestBus()
        bus.store(1, "s", handles: ["s/*"], state: #"{"\u00e9":1}"#)
        _ = bus.take(1)
        bus.send(1, #"{"op":"patch","store":"s","patch":[{"op":"move","from":"/\u00e9","path":"/e\u0301"}]}"#)
        #expect(!bus.closedPeers.contains(1))
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"get","store":"s"}"#)
        #expect(bus.take(2).last?.rawText("state") == "{\"e\u{301}\":1}")
        // A path subscription to one is not touched by a change to the other.
        bus.send(2, #"{"op":"subscribe","store":"s","path":"/\u00e9"}"#)
        _ = bus.take(2)
        bus.send(1, #"{"op":"patch","store":"s","patch":[{"op":"replace","path":"/e\u0301","value":2}]}"#)
        #expect(bus.take(2).isEmpty)
        #expect(!Router.touches(.replace(path: JSONPointer(tokens: ["e\u{301}"]), value: .null), ["\u{e9}"]))
    }

    // MARK: - Path subscriptions

    @Test("2,000 path subscribes to a store that publishes whole states parse its state once")
    func subscribeParsesOnce() {
        let bus = TestBus()
        let todos = (0..<2_000).map { #"{"id":\#($0),"title":"todo \#($0)"}"# }.joined(separator: ",")
        bus.store(1, "s", handles: ["s/*"], state: #"{"todos":[\#(todos)]}"#)
        bus.join(2, role: "client")
        let parsed = bus.router.statesParsed
        for i in 0..<2_000 {
            bus.send(2, #"{"op":"subscribe","store":"s","path":"/todos/\#(i % 1_000)/title"}"#)
        }
        #expect(bus.take(2).filter { $0.op == "subtree" }.count == 2_000)
        #expect(bus.router.statesParsed - parsed == 1)
    }

    @Test("a whole-state store's tree kept for path subscriptions is charged to a path subscriber, never the publisher; it moves to another subscriber, then goes, when its payer leaves")
    func pathTreeChargedToSubscriber() throws {
        let bus = TestBus()
        func state(_ tag: String) -> String {
            #"{"todos":[\#((0..<200).map { #"{"id":\#($0),"title":"\#(tag) \#($0)"}"# }.joined(separator: ","))]}"#
        }
        bus.store(1, "s", handles: ["s/*"], state: state("a"))
        let store = try #require(bus.router.stores["s"])
        let publisher = try #require(bus.router.peers[1]).account
        let snapshotCost = store.retainedCost
        let publisherHeld = publisher.held
        for (id, uid) in [(2, 2000), (3, 3000)] as [(PeerID, UInt32)] {
            bus.feed(.connected(id, PeerCredentials(pid: Int32(id), uid: uid)))
            bus.send(id, #"{"op":"hello","protocol":1,"role":"client"}"#)
        }
        let two = try #require(bus.router.peers[2]).account, three = try #require(bus.router.peers[3]).account
        let before2 = two.held
        bus.send(2, #"{"op":"subscribe","store":"s","path":"/todos/3/title"}"#)
        let treeCost = store.treePayerCost
        #expect(treeCost == bus.router.treeCost(store, bytes: store.tree!.byteCount) && treeCost > 8 * 200 * 20)
        #expect(store.treePayer === bus.router.peers[2])
        #expect(two.held - before2 == treeCost + Router.subscriptionCost("s") + #""/todos/3/title""#.utf8.count)
        #expect(store.retainedCost == snapshotCost && publisher.held == publisherHeld, "the publisher pays for its snapshot only")
        // A new whole state: parsed again for the path subscriber, who pays for it again; the publisher pays its bytes.
        bus.send(1, #"{"op":"state","store":"s","state":\#(state("b"))}"#)
        #expect(bus.take(2).filter { $0.op == "subtree" }.last?.rawText("value") == #""b 3""#)
        #expect(store.treePayer === bus.router.peers[2] && store.treePayerCost > 0)
        #expect(store.retainedCost == snapshotCost)
        // The payer leaves: the other path subscriber takes the charge over; when it leaves too, the tree goes.
        bus.send(3, #"{"op":"subscribe","store":"s","path":"/todos/4"}"#)
        let before3 = three.held
        bus.send(2, #"{"op":"unsubscribe","store":"s","path":"/todos/3/title"}"#)
        #expect(store.treePayer === bus.router.peers[3])
        #expect(three.held - before3 == store.treePayerCost)
        #expect(two.held == before2)
        bus.disconnect(3)
        #expect(store.tree == nil && store.treePayer == nil)
        // The publisher patches it: the tree it patches is its own again (charged to it, whole).
        bus.send(2, #"{"op":"subscribe","store":"s","path":"/todos/5"}"#)
        bus.send(1, #"{"op":"patch","store":"s","patch":[{"op":"replace","path":"/todos/5/title","value":"x"}]}"#)
        #expect(store.treePayer == nil && two.held == before2 + Router.subscriptionCost("s") + #""/todos/5""#.utf8.count)
        #expect(store.retainedCost == bus.router.treeCost(store, bytes: store.tree!.byteCount))
    }

    @Test("protocol/vectors/patch.json \"touches\": Router.touches and PathIndex say what the vectors say (SPEC §16.4)")
    func touchesVectors() throws {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("protocol/vectors/patch.json")
        let file = try JSONValue(parsing: Array(try Data(contentsOf: url)), maxDepth: 128)
        let cases = try #require(file["touches"]?.arrayValue)
        #expect(cases.count >= 19)
        let peer = Self.peer()
        for c in cases {
            let comment = c["comment"]?.stringValue ?? "?"
            var tree = JSONTree(try #require(c["doc"]))
            let applied = try tree.apply(try JSONPatch(try #require(c["patch"])))
            let path = try JSONPointer(parsing: try #require(c["path"]?.stringValue)).tokens
            let expected: Bool = try #require(c["touches"]?.boolValue as Bool?)
            #expect(applied.contains { Router.touches($0, path) } == expected, Comment(rawValue: comment))
            let index = PathIndex()
            index.insert(PathSubscription(peer: peer, store: "s", path: "", tokens: path, key: 1, order: 1))
            #expect(index.touched(by: applied).isEmpty == !expected, Comment(rawValue: "PathIndex: " + comment))
        }
    }

    static func peer() -> Peer {
        let budget = MemoryBudget(limits: MemoryBudget.Limits())
        return Peer(id: 1, creds: PeerCredentials(pid: 1, uid: 1), connectedAt: 0, account: budget.userAccount(uid: 1))
    }

    @Test("PathIndex finds exactly the subscriptions Router.touches says a patch touches (random paths and patches)")
    func pathIndexAgainstTouches() {
        var r = SplitMixR(state: 4)
        let peer = Self.peer()
        let tokens = ["a", "b", "0", "1", "2", "10", "01", "-", "\u{e9}", "e\u{301}", ""]
        func path(_ max: Int) -> [String] { (0..<r.below(max + 1)).map { _ in tokens[r.below(tokens.count)] } }
        for round in 0..<300 {
            let index = PathIndex()
            var subs: [PathSubscription] = []
            for n in 0..<(1 + r.below(40)) {
                let sub = PathSubscription(peer: peer, store: "s", path: "", tokens: path(4), key: UInt32(n), order: UInt64(n))
                subs.append(sub)
                index.insert(sub)
            }
            for sub in subs where r.below(5) == 0 {
                index.remove(sub)
                subs.removeAll { $0 === sub }
            }
            #expect(index.count == subs.count)
            for _ in 0..<5 {
                let ops: [JSONPatchOperation] = (0..<(1 + r.below(4))).map { _ in
                    let p = JSONPointer(tokens: path(4)), f = JSONPointer(tokens: path(4))
                    switch r.below(6) {
                    case 0: return .add(path: p, value: .null)
                    case 1: return .remove(path: p)
                    case 2: return .replace(path: p, value: .null)
                    case 3: return .move(from: f, path: p)
                    case 4: return .copy(from: f, path: p)
                    default: return .test(path: p, value: .null)
                    }
                }
                let expected = subs.filter { sub in ops.contains { Router.touches($0, sub.tokens) } }.map(\.order)
                let got = index.touched(by: ops).map(\.order)
                #expect(got == expected, "round \(round): \(ops.map(\.json.compact)) on \(subs.map(\.tokens))")
            }
        }
        withExtendedLifetime(peer) {}
    }

    @Test("a patch touching none of 10,000 path subscriptions visits a few nodes per operation")
    func pathIndexWork() {
        let peer = Self.peer()
        let index = PathIndex()
        for i in 0..<10_000 {
            index.insert(PathSubscription(peer: peer, store: "s", path: "", tokens: ["todos", String(i), "title"], key: UInt32(i), order: UInt64(i)))
        }
        let far = (0..<2_000).map { JSONPatchOperation.replace(path: JSONPointer(tokens: ["other", String($0)]), value: .null) }
        #expect(index.touched(by: far).isEmpty)
        #expect(index.lastSteps <= 2 * 2_000, "\(index.lastSteps) node visits")
        // An insertion at /todos/9990 touches the ten after it, walking only them.
        let insert = [JSONPatchOperation.add(path: JSONPointer(tokens: ["todos", "9990"]), value: .null)]
        #expect(index.touched(by: insert).count == 10)
        #expect(index.lastSteps <= 10 * 3 + 4, "\(index.lastSteps) node visits")
        // 2,000 insertions at the front touch all of them once.
        let front = (0..<2_000).map { _ in JSONPatchOperation.add(path: JSONPointer(tokens: ["todos", "0"]), value: .null) }
        #expect(index.touched(by: front).count == 10_000)
        #expect(index.lastSteps <= 2_000 * 3 + 10_000 * 3, "\(index.lastSteps) node visits")
        withExtendedLifetime(peer) {}
    }
}

/// SplitMix64 (the router tests' own copy).
struct SplitMixR {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}
