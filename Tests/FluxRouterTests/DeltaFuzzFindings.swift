import FluxCore
import FluxJSONValue
import Testing
@testable import FluxRouter

/// What the router fuzz target's SPEC §16 checks found (docs/fuzzing.md, Findings), each as the smallest router
/// test that shows it. They fail until the router is fixed; the fuzz target tolerates them unless
/// FLUXBUS_FUZZ_STRICT=1.
@Suite("SPEC §16 findings of the router fuzz target")
struct DeltaFuzzFindings {
    @Test("a connection that closes holding a path subscription is freed (PathSubscription and Peer hold each other)")
    func pathSubscriberIsFreed() {
        let bus = DeltaTests.bus()  // peer 2: a full subscriber; peer 4: path subscriptions to /todos/1 and /n
        weak let full = bus.router.peers[2]
        weak let path = bus.router.peers[4]
        #expect(full != nil && path != nil)
        bus.disconnect(2)
        bus.disconnect(4)
        #expect(full == nil, "a full subscriber's peer is freed when it closes")
        #expect(path == nil, "a path subscriber's peer is freed when it closes")
    }

    @Test("a delta is not overtaken by a snapshot queued before it (newest wins replaces in place)")
    func deltaNotOvertaken() throws {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"n":1}"#)
        _ = bus.take(1)
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"todos","deltas":true}"#)
        _ = bus.take(3)
        let start = bus.marks[3]!.count
        bus.send(1, #"{"op":"state","store":"todos","state":{"n":2}}"#)                        // v2: a snapshot
        bus.send(1, #"{"op":"patch","store":"todos","patch":[{"op":"replace","path":"/n","value":3}]}"#)  // v3: a delta
        bus.send(1, #"{"op":"state","store":"todos","state":{"n":4}}"#)                        // v4: a snapshot
        let sent = bus.take(3)
        let marks = Array(bus.marks[3]![start...])
        #expect(sent.map(\.op) == ["snapshot", "delta", "snapshot"])
        // A connection whose writes are held queues them as FluxTransport's Connection.send does (Frame.swift,
        // Coalescing): a newest-wins frame takes the place of the unwritten one with its key, unless a fence
        // with that key was queued since.
        var queue: [Envelope] = []
        var replaceable: [UInt32: Int] = [:]
        for (env, mark) in zip(sent, marks) {
            switch mark.coalescing {
            case .newestWins(let key):
                if let i = replaceable[key] { queue[i] = env; continue }
                replaceable[key] = queue.count
            case .fence(let key): replaceable[key] = nil
            case .none: break
            }
            queue.append(env)
        }
        // What the client receives must chain: each delta from the version it holds.
        var held: Int64 = 1
        for env in queue {
            if env.op == "delta" {
                #expect(env.num("from") == held, "received \(queue.map { "\($0.op) v\($0.num("version") ?? 0)" }): a delta from \(env.num("from") ?? 0) while holding version \(held)")
            }
            held = env.num("version") ?? held
        }
    }

    @Test("an add at /todos/- touches /todos/N where N was the array's length (the element appended is there)")
    func appendTouchesTheNewIndex() {
        let bus = DeltaTests.bus()  // todos has 3 elements
        bus.join(8, role: "client")
        bus.send(8, #"{"op":"subscribe","store":"todos","path":"/todos/3"}"#)
        #expect(bus.take(8).last?.bool("exists").value == false)
        _ = DeltaTests.act(bus, #","patch":[{"op":"add","path":"/todos/-","value":{"id":4,"done":false}}]"#)
        let subtree = bus.take(8).first { $0.op == "subtree" }
        #expect(subtree?.bool("exists").value == true, "R5 for paths (SPEC §16.4): the subscriber still holds exists:false")
        #expect(subtree?.rawText("value") == #"{"id":4,"done":false}"#)
    }

    @Test("a retained tree is charged for its size, not for every patch it was ever sent")
    func treeChargeDoesNotGrow() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"n":0}"#)
        _ = bus.take(1)
        for n in 1...200 {
            bus.send(1, #"{"op":"patch","store":"todos","patch":[{"op":"replace","path":"/n","value":\#(n)}]}"#)
        }
        let store = bus.router.stores["todos"]!
        let stateBytes = #"{"n":200}"#.utf8.count
        // SPEC §16.5: "charged to the memory budget like the retained snapshot": exactly its rendered size (the
        // tree's summaries know it), times Router.treeOverhead.
        #expect(store.retainedCost == 96 + store.nameJSON.count + Router.treeOverhead * stateBytes,
                "\(store.retainedCost) bytes charged for a state of \(stateBytes) bytes after 200 patches")
        #expect(!bus.closedPeers.contains(1))
    }

    @Test("a patch that fails leaves the retained state charged to whoever it was charged to")
    func failedPatchKeepsTheCharge() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"], state: #"{"n":0}"#)
        bus.disconnect(1)
        // Another user's store registers the name (the snapshot stays charged to uid 1000) and sends a bad patch.
        bus.feed(.connected(11, PeerCredentials(pid: 11, uid: 1001)))
        bus.send(11, #"{"op":"hello","protocol":1,"role":"store"}"#)
        bus.register(11, "todos", handles: ["todo/*"])
        #expect(bus.router.stores["todos"]!.retainedBy?.uid == 1000)
        bus.send(11, #"{"op":"patch","store":"todos","patch":[{"op":"remove","path":"/nope"}]}"#)
        #expect(bus.take(11).last?.str("code") == "patch-failed")
        #expect(bus.router.stores["todos"]!.retainedBy?.uid == 1000, "nothing of a failed patch is kept (SPEC §16.2)")
    }

    @Test("a done with state and patch for a store with no state is sent to delta subscribers as a snapshot")
    func noDeltaFromVersionZero() {
        let bus = TestBus()
        bus.store(1, "todos", handles: ["todo/*"])
        _ = bus.take(1)
        bus.join(3, role: "client")
        bus.send(3, #"{"op":"subscribe","store":"todos","deltas":true}"#)
        #expect(bus.ops(3) == ["subscribed"])
        bus.join(6, role: "client")
        _ = DeltaTests.act(bus, #","state":{"n":1},"patch":[{"op":"add","path":"/n","value":1}]"#)
        let got = bus.take(3)
        #expect(got.map(\.op) == ["snapshot"], "a delta from version 0 (SPEC §16.3: from >= 1): \(got.map(\.text))")
    }
}
