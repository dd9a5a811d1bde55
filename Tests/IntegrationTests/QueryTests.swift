import FluxClient
import FluxCore
import Foundation
import Testing

/// The `comments` store's state (comments-store), as seen on the wire.
struct CommentsSeen: Codable, Equatable, Sendable {
    struct Comment: Codable, Equatable, Sendable {
        var id: Int
        var site: Int
        var parent: Int
        var content: String
    }
    var comments: [String: [Comment]]
    var fetching: [String: Bool]
    var errors: [String: String]
    var activeSites: [Int]
}

struct SiteQuery: Codable, Sendable { var site: Int }

struct ReplyPayload: Codable, Sendable {
    var site: Int
    var parent: Int
    var content: String
}

/// Guarantee 6, queries: clients declare what they want; the store is told the deduplicated set (with counts)
/// whenever it changes; a client's queries end when it withdraws them or disconnects.
@Suite("queries")
struct QueryTests {
    @Test("comments-store: activeSites follows the clients' queries, withdrawals and disconnects; queried sites get loaded")
    func activeSitesFollowQueries() async throws {
        try await withBus { bus in
            _ = try await bus.start("comments-store", ["--latency-ms", "20"])
            let observer = try await bus.connect("observer")
            let events = EventLog(observer.subscribe(store: "comments", as: CommentsSeen.self))
            defer { events.cancel() }
            try await events.wait("initial comments snapshot") { $0.contains { $0.snapshot != nil } }

            let a = try await bus.connect("client-a")
            let b = try await bus.connect("client-b")
            let a1 = try await withDeadline(.seconds(20), "A queries site 1") { try await a.query(store: "comments", SiteQuery(site: 1)) }
            let b1 = try await withDeadline(.seconds(20), "B queries site 1") { try await b.query(store: "comments", SiteQuery(site: 1)) }
            let b2 = try await withDeadline(.seconds(20), "B queries site 2") { try await b.query(store: "comments", SiteQuery(site: 2)) }

            // Both sites become active, and the store fetches them because they are wanted.
            let loaded = try await events.wait("sites 1 and 2 active and loaded") { items in
                guard let s = items.last(where: { $0.snapshot != nil })?.snapshot?.state else { return false }
                return s.activeSites == [1, 2] && s.comments["1"] != nil && s.comments["2"] != nil
            }
            let state = try #require(loaded.last { $0.snapshot != nil }?.snapshot?.state)
            #expect(state.comments["1"]?.map(\.content) == ["Comment 1 on site 1", "Comment 2 on site 1", "Comment 3 on site 1"])
            #expect(state.comments["2"]?.count == 3)
            #expect(state.fetching["1"] != true && state.fetching["2"] != true)
            #expect(state.comments["7"] == nil, "nobody asked for site 7")
            #expect(loaded.compactMap { $0.snapshot?.state.activeSites }.allSatisfy { Set($0).isSubset(of: [1, 2]) })

            // B withdraws site 2: only site 1 stays active.
            b2.cancel()
            try await events.wait("activeSites [1] after B's unquery") { $0.last { $0.snapshot != nil }?.snapshot?.state.activeSites == [1] }
            let mark = events.items.count

            // A leaves (bye): B still holds site 1. The reply below is handled by the store after fluxd told it the
            // new query set (fluxd processed A's close before reading our dispatch), so its snapshot shows the
            // outcome, and no snapshot before it may have dropped site 1.
            await a.close()
            let reply = try await withDeadline(.seconds(20), "reply on site 1") {
                try await observer.dispatchAndSettle(type: "comments/reply", payload: ReplyPayload(site: 1, parent: 0, content: "after A left"))
            }
            #expect(reply.allDone, "\(reply)")
            let afterA = try await events.wait("the reply's snapshot") { items in
                items.contains { $0.snapshot?.state.comments["1"]?.contains { $0.content == "after A left" } == true }
            }
            let sinceA = afterA[mark...].compactMap { $0.snapshot?.state.activeSites }
            #expect(!sinceA.isEmpty && sinceA.allSatisfy { $0 == [1] }, "site 1 must stay active while B holds it: \(sinceA)")

            // B disconnects without a word (like a crash): nothing is wanted any more.
            b.abort()
            try await events.wait("activeSites [] after B left") { $0.last { $0.snapshot != nil }?.snapshot?.state.activeSites == [] }
            withExtendedLifetime((a1, b1)) {}
        }
    }

    @Test("comments-store --fail-sites: a failing site's fetch error surfaces in the state, other sites load")
    func failingSiteSurfacesItsError() async throws {
        try await withBus { bus in
            _ = try await bus.start("comments-store", ["--latency-ms", "20", "--fail-sites", "3"])
            let client = try await bus.connect("view")
            let events = EventLog(client.subscribe(store: "comments", as: CommentsSeen.self))
            defer { events.cancel() }
            let q3 = try await withDeadline(.seconds(20), "query site 3") { try await client.query(store: "comments", SiteQuery(site: 3)) }
            let q4 = try await withDeadline(.seconds(20), "query site 4") { try await client.query(store: "comments", SiteQuery(site: 4)) }
            let seen = try await events.wait("site 3 failed and site 4 loaded") { items in
                guard let s = items.last(where: { $0.snapshot != nil })?.snapshot?.state else { return false }
                return s.errors["3"] != nil && s.comments["4"] != nil
            }
            let state = try #require(seen.last { $0.snapshot != nil }?.snapshot?.state)
            #expect(state.errors["3"]?.contains("site 3") == true)
            #expect(state.comments["3"] == nil)
            #expect(state.fetching["3"] != true)
            #expect(state.errors["4"] == nil)
            #expect(state.activeSites == [3, 4])
            // While the fetch ran, the state said so.
            #expect(seen.contains { $0.snapshot?.state.fetching["3"] == true })
            withExtendedLifetime((q3, q4)) {}
        }
    }

    @Test("wire: the store is told the deduplicated query set with counts on every change, disconnects included", .onDedicatedThreads)
    func queriesWithCountsOnTheWire() throws {
        try withBusBlocking { bus in
            let path = bus.socketPath
            // A query may name a store that is not registered yet; it is in the set the store gets on registering.
            let early = try RawPeer.ready(path, name: "early")
            try early.send(frame: #"{"op":"query","id":"e1","store":"q","query":{"site":9}}"#)
            #expect(try early.expect("query-ok").string("id") == "e1")

            let store = try RawPeer.ready(path, role: "store", name: "store")
            let registration = try store.register("q", handles: [])
            #expect(registration.last?.text == #"{"op":"queries","store":"q","queries":[{"query":{"site":9},"count":1}]}"#)

            func expectQueries(_ expected: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
                let m = try store.expect("queries")
                let queries = String(decoding: try JSONSerialization.data(withJSONObject: m["queries"] ?? [], options: [.sortedKeys]), as: UTF8.self)
                #expect(queries == expected, sourceLocation: sourceLocation)
            }

            var a: RawPeer? = try RawPeer.ready(path, name: "a")
            var b: RawPeer? = try RawPeer.ready(path, name: "b")
            try a!.send(frame: #"{"op":"query","id":"a1","store":"q","query":{"site":1}}"#)
            #expect(try a!.expect("query-ok").string("id") == "a1")
            try expectQueries(#"[{"count":1,"query":{"site":1}},{"count":1,"query":{"site":9}}]"#)
            try b!.send(frame: #"{"op":"query","id":"b1","store":"q","query":{"site":1}}"#)
            try b!.expect("query-ok")
            try expectQueries(#"[{"count":2,"query":{"site":1}},{"count":1,"query":{"site":9}}]"#)
            try b!.send(frame: #"{"op":"query","id":"b2","store":"q","query":{"site":2}}"#)
            try b!.expect("query-ok")
            try expectQueries(#"[{"count":2,"query":{"site":1}},{"count":1,"query":{"site":2}},{"count":1,"query":{"site":9}}]"#)
            // A live query id reused on the same connection is refused, and changes nothing.
            try b!.send(frame: #"{"op":"query","id":"b2","store":"q","query":{"site":5}}"#)
            let dup = try b!.expect("error")
            #expect(dup.string("code") == "bad-message")
            #expect(dup.string("ref") == "b2")
            try b!.send(frame: #"{"op":"unquery","id":"b2"}"#)
            #expect(try b!.expect("unquery-ok").string("id") == "b2")
            try expectQueries(#"[{"count":2,"query":{"site":1}},{"count":1,"query":{"site":9}}]"#)
            try b!.send(frame: #"{"op":"unquery","id":"b2"}"#)
            #expect(try b!.expect("error").string("code") == "bad-message")

            a = nil // hang up without bye: its query ends, B still holds site 1
            try expectQueries(#"[{"count":1,"query":{"site":1}},{"count":1,"query":{"site":9}}]"#)
            b = nil
            try expectQueries(#"[{"count":1,"query":{"site":9}}]"#)
            try early.send(frame: #"{"op":"bye"}"#)
            try expectQueries("[]")
            #expect(try store.barrier().isEmpty)
        }
    }
}
