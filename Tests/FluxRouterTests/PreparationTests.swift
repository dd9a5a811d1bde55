import FluxCore
import Foundation
import FluxJSONValue
import Testing
@testable import FluxRouter

/// Work off the loop (issue 24, `Router+Preparation.swift`): a large patch or parse is a `Preparation` the host
/// runs on another thread; the peer's frames wait behind it in order, every other peer is served meanwhile, and
/// the outcome is the one inline work gives.
@Suite("Preparations: large patches and parses off the loop")
struct PreparationTests {
    /// A patch adding `n` keys (`k<from>`...) to `/o`.
    static func keys(_ n: Int, from: Int = 0) -> String {
        "[" + (from..<(from + n)).map { #"{"op":"add","path":"/o/k\#($0)","value":\#($0)}"# }.joined(separator: ",") + "]"
    }

    /// A bus whose preparations wait for `runPreparations()`, with a store "s" (peer 1) of `{"o":{}}`, a full
    /// subscriber and dispatcher (peer 2) and a bystander client of another user (peer 3).
    static func bus(deferred: Bool = true, threshold: Int = 1024, _ configure: (inout RouterConfig) -> Void = { _ in }) -> TestBus {
        let bus = TestBus { c in
            c.preparationBytes = threshold
            configure(&c)
        }
        bus.deferPreparations = deferred
        bus.store(1, "s", handles: ["s/*"], state: #"{"o":{}}"#)
        bus.join(2, role: "client")
        bus.send(2, #"{"op":"subscribe","store":"s"}"#)
        bus.feed(.connected(3, PeerCredentials(pid: 3, uid: 2000)))
        bus.send(3, #"{"op":"hello","protocol":1,"role":"client"}"#)
        _ = bus.take(1); _ = bus.take(2); _ = bus.take(3)
        return bus
    }

    @Test("a large patch in done is applied off the loop: the store's later frames wait, another user is served, then all comes out in order as inline")
    func patchOffTheLoop() throws {
        let bus = Self.bus()
        bus.send(2, #"{"op":"dispatch","id":"d1","type":"s/add","settle":true,"payload":{}}"#)
        let action = try #require(bus.take(1).first { $0.op == "action" })
        let seq = try #require(action.num("seq"))
        let prepared = bus.router.preparationsStarted
        bus.send(1, #"{"op":"done","store":"s","seq":\#(seq),"patch":\#(Self.keys(100))}"#)
        bus.send(1, #"{"op":"ping","id":"after"}"#)
        // Held: nothing of the patch or of the ping behind it yet.
        #expect(bus.preparations.count == 1)
        #expect(bus.router.preparationsStarted == prepared + 1)
        #expect(bus.take(1).isEmpty && bus.take(2).isEmpty)
        // Another user's requests go on meanwhile.
        bus.send(3, #"{"op":"ping","id":"p3"}"#)
        #expect(bus.ops(3) == ["pong"])
        bus.runPreparations()
        // R4/R5 as inline: the subscriber's snapshot before the settlement; then the store's ping is answered.
        #expect(bus.take(2).map(\.op) == ["snapshot", "settled"])
        #expect(bus.take(1).map(\.op) == ["pong"])
        bus.send(3, #"{"op":"get","store":"s"}"#)
        let state = try #require(bus.take(3).last?.raw("state"))
        #expect(try JSONValue(parsing: Array(state)) == JSONValue(parsing: Array(#"{"o":{\#((0..<100).map { "\"k\($0)\":\($0)" }.joined(separator: ","))}}"#.utf8)))
        #expect(bus.router.stores["s"]?.version == 2)
    }

    @Test("info on a bus of more stores than infoStoresOffLoopAbove: the list is encoded off the loop, the asker's ping waits behind it, another user is served, and the reply is the one inline work gives")
    func infoOfManyStoresOffTheLoop() throws {
        let bus = Self.bus()
        let count = Router.infoStoresOffLoopAbove + 100
        // (Registered from two connections: each may own maxStoresPerConnection stores.)
        bus.join(10, role: "store", name: "many-a")
        bus.join(11, role: "store", name: "many-b")
        for i in 0..<count { bus.register(i.isMultiple(of: 2) ? 10 : 11, "m\(i)", handles: ["m\(i)/*"]) }
        _ = bus.take(10); _ = bus.take(11)
        let expected = (["s"] + (0..<count).map { "m\($0)" }).sorted()
        // Inline (deferPreparations off) and deferred give the same list.
        let prepared = bus.router.preparationsStarted
        bus.send(2, #"{"op":"info","id":"i1"}"#)
        bus.send(2, #"{"op":"ping","id":"after"}"#)
        #expect(bus.preparations.count == 1)
        #expect(bus.router.preparationsStarted == prepared + 1)
        #expect(bus.take(2).isEmpty)
        bus.send(3, #"{"op":"ping","id":"p3"}"#)
        #expect(bus.ops(3) == ["pong"])
        // The rows are the asker's while they are encoded: charged to its user, released with the reply.
        let charged = bus.router.memory.used
        #expect(charged > Router.infoStoresOffLoopAbove * 256)
        bus.runPreparations()
        #expect(bus.router.memory.used < charged - Router.infoStoresOffLoopAbove * 256)
        let got = bus.take(2)
        #expect(got.map(\.op) == ["info", "pong"])
        let info = try JSONSerialization.jsonObject(with: Data(try #require(got.first).body)) as? [String: Any]
        let stores = try #require(info?["stores"] as? [[String: Any]])
        #expect(stores.map { $0["name"] as? String } == expected)
        #expect(stores.first { $0["name"] as? String == "m1" }?["owner"] != nil)
    }

    @Test("info on a bus of few stores is answered at once, without a preparation")
    func infoOfFewStoresInline() {
        let bus = Self.bus()
        let prepared = bus.router.preparationsStarted
        bus.send(2, #"{"op":"info","id":"i1"}"#)
        #expect(bus.ops(2) == ["info"])
        #expect(bus.router.preparationsStarted == prepared)
    }

    @Test("the same sequence of frames makes the same frames for everyone whether patches are prepared or inline")
    func sameAsInline() {
        func run(_ threshold: Int) -> [PeerID: [String]] {
            let bus = Self.bus(deferred: false, threshold: threshold)
            bus.send(2, #"{"op":"subscribe","store":"s","path":"/o/k7"}"#)
            bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.keys(50))}"#)
            bus.send(1, #"{"op":"patch","store":"s","base":2,"patch":[{"op":"replace","path":"/o/k7","value":"x"}]}"#)
            bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.keys(50, from: 40))}"#)  // k40..k49 exist: add replaces
            bus.send(1, #"{"op":"patch","store":"s","patch":[{"op":"remove","path":"/o/nope"}\#(String(repeating: #",{"op":"test","path":"/o","value":{}}"#, count: 40))]}"#)
            bus.send(3, #"{"op":"get","store":"s"}"#)
            return [1: bus.take(1).map(\.text), 2: bus.take(2).map(\.text), 3: bus.take(3).map(\.text)]
        }
        let inline = run(1 << 30), prepared = run(64)
        #expect(prepared == inline)
        #expect(inline[1]?.last?.contains("patch-failed") == true, "\(inline[1] ?? [])")
    }

    @Test("a patch that does not apply, prepared off the loop, closes the store with patch-failed; the state is as it was")
    func failedPatch() throws {
        let bus = Self.bus()
        bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.keys(60))}"#)
        bus.runPreparations()
        let bad = Self.keys(60, from: 100).dropLast() + #",{"op":"remove","path":"/o/missing"}]"#
        bus.send(1, #"{"op":"patch","store":"s","patch":\#(bad)}"#)
        #expect(bus.preparations.count == 1)
        bus.runPreparations()
        #expect(bus.take(1).last?.str("code") == "patch-failed")
        #expect(bus.closedPeers.contains(1))
        bus.send(3, #"{"op":"get","store":"s"}"#)
        let state = try #require(bus.take(3).last?.raw("state"))
        #expect(state.count > 60 * 8 && !String(decoding: state, as: UTF8.self).contains("k100"))
    }

    @Test("frames held behind a preparation are charged to the peer, taken 256 per turn, and dropped with their charge when it closes")
    func heldFrames() {
        let bus = Self.bus()
        let account = bus.router.peers[1]!.account
        let before = account.held
        bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.keys(60))}"#)
        for i in 0..<600 { bus.send(1, #"{"op":"ping","id":"h\#(i)"}"#) }
        #expect(account.held > before + 600 * 20)
        bus.runPreparations()  // the patch, then three turns of held pings (256, 256, 88)
        let pongs = bus.take(1).filter { $0.op == "pong" }.map { $0.str("id") ?? "" }
        #expect(pongs == (0..<600).map { "h\($0)" })
        #expect(bus.router.preparationsStarted == 1, "the turns of the held frames are not preparations")
        #expect(account.held < before + 600 * 20)
        // Held again, then closed: the held frames go with their charge.
        let used = bus.router.memory.used
        bus.send(1, #"{"op":"patch","store":"s","patch":\#(Self.keys(60, from: 100))}"#)
        for i in 0..<100 { bus.send(1, #"{"op":"ping","id":"g\#(i)"}"#) }
        bus.disconnect(1)
        bus.runPreparations()  // the result for a closed peer is ignored
        #expect(bus.take(1).isEmpty)
        #expect(bus.router.memory.used <= used)
    }

    @Test("a path subscribe on a large whole-state store parses it off the loop once; later subscribes use the kept tree")
    func subscribeParsesOffTheLoop() {
        let bus = TestBus { $0.preparationBytes = 1024 }
        bus.deferPreparations = true
        let items = (0..<200).map { #"{"id":\#($0),"title":"todo \#($0)"}"# }.joined(separator: ",")
        bus.store(1, "s", handles: ["s/*"], state: #"{"todos":[\#(items)]}"#)
        bus.join(2, role: "client")
        let parsed = bus.router.statesParsed
        bus.send(2, #"{"op":"subscribe","store":"s","path":"/todos/7/title"}"#)
        bus.send(2, #"{"op":"ping","id":"after"}"#)
        #expect(bus.take(2).isEmpty && bus.preparations.count == 1)
        bus.runPreparations()
        let got = bus.take(2)
        #expect(got.map(\.op) == ["subscribed", "subtree", "pong"])
        #expect(got[1].rawText("value") == #""todo 7""#)
        for i in 0..<50 { bus.send(2, #"{"op":"subscribe","store":"s","path":"/todos/\#(i)/id"}"#) }
        #expect(bus.preparations.isEmpty)
        #expect(bus.take(2).filter { $0.op == "subtree" }.count == 50)
        #expect(bus.router.statesParsed - parsed == 1)
        // A new whole state with path subscribers is parsed off the loop too (the store's frame waits).
        bus.send(1, #"{"op":"state","store":"s","state":{"todos":[\#(items.replacingOccurrences(of: "todo 7\"", with: "seven\""))]}}"#)
        #expect(bus.take(2).isEmpty && bus.preparations.count == 1)
        bus.runPreparations()
        let changed = bus.take(2)
        #expect(changed.map(\.op) == ["subtree"])
        #expect(changed.first?.rawText("value") == #""seven""#)
    }
}
