import FluxClient
import FluxCore
import FluxStore
import FluxTesting
import Foundation
import Logging
import Synchronization
import Testing

private struct Toggle: Codable, Sendable { var id: Int; var done: Bool }
private struct Tagged: Codable, Sendable {
    struct Item: Codable, Sendable { var name: String; var count: Int }
    enum Kind: String, Codable, Sendable { case a, b }
    var items: [Item]
    var kind: Kind
}

/// A todo store with two handlers (the message of an unhandled action lists them).
private func strictStore(unhandled: UnhandledActions = .reject, logger: Logger = Logger(label: "test")) -> FluxStore<TodoState> {
    let store = FluxStore<TodoState>(name: "todos", initial: TodoState(), handles: ["todo/*"], unhandled: unhandled, logger: logger)
    store.on("todo/add", as: AddTodo.self) { state, action, _ in
        state.todos.append(Todo(id: state.nextID, title: action.title))
        state.nextID += 1
    }
    store.on("todo/toggle", as: Toggle.self) { state, action, _ in
        guard let i = state.todos.firstIndex(where: { $0.id == action.id }) else { return }
        state.todos[i].done = action.done
    }
    store.on("todo/tagged", as: Tagged.self) { _, _, _ in }
    store.on("todo/explode") { _, _ in
        struct Boom: Error {}
        throw Boom()
    }
    store.on("todo/describe") { _, _ in
        struct Described: Error, CustomStringConvertible { var description: String { "the disk is full" } }
        throw Described()
    }
    return store
}

/// The one result of a settlement (the test stores are the only targets).
private func only(_ s: Settlement) throws -> StoreResult.Status {
    try #require(s.results.count == 1, "\(s)")
    return s.results[0].status
}

@Suite("Strict, clear defaults: unhandled actions, readable rejections")
struct StrictDefaultsTests {
    @Test("an action matching the store's patterns but no handler is rejected naming the type and the handled types")
    func unhandledActionsAreRejectedNamingTheHandledTypes() async throws {
        let bus = InMemoryBus()
        let running = try await bus.start(strictStore())
        let client = try await bus.client()
        let settlement = try await client.dispatchAndSettle(type: "todo/frobnicate")
        #expect(try only(settlement) == .rejected(
            code: "store/unhandled-action",
            message: "no handler for 'todo/frobnicate'; this store handles: todo/add, todo/describe, todo/explode, todo/tagged, todo/toggle"))
        #expect(throws: FluxError.rejected(
            store: "todos", code: "store/unhandled-action",
            message: "no handler for 'todo/frobnicate'; this store handles: todo/add, todo/describe, todo/explode, todo/tagged, todo/toggle")) {
            try settlement.requireDone()
        }
        // A handled action still works, and the rejected one changed nothing.
        let added = try await client.dispatchAndSettle(type: "todo/add", payload: AddTodo(title: "milk"))
        #expect(try only(added) == .done(version: 2))
        try await running.stop()
    }

    @Test("a store may opt into ignoring unhandled actions: they are answered done, unchanged")
    func unhandledActionsCanBeIgnoredExplicitly() async throws {
        let bus = InMemoryBus()
        let store = strictStore(unhandled: .ignore)
        let running = try await bus.start(store)
        let client = try await bus.client()
        let settlement = try await client.dispatchAndSettle(type: "todo/frobnicate")
        #expect(try only(settlement) == .done(version: 1))
        #expect(store.state == TodoState())
        try await running.stop()
    }

    @Test("bad payloads are rejected with store/bad-payload and a message for the person who dispatched", arguments: [
        ("todo/add", #"{"titel":"typo"}"#, "payload of todo/add: field 'title' is missing"),
        ("todo/add", #"{"title":7}"#, "payload of todo/add: field 'title': expected a string, found a number"),
        ("todo/toggle", #"{"id":1,"done":"yes"}"#, "payload of todo/toggle: field 'done': expected a boolean, found a string"),
        ("todo/toggle", #"{"id":1.5,"done":true}"#, "payload of todo/toggle: field 'id': expected a whole number, found 1.5"),
        ("todo/toggle", #"{"id":null,"done":true}"#, "payload of todo/toggle: field 'id': expected a whole number, found null"),
        ("todo/add", "null", "payload of todo/add: expected an object, found null"),
        ("todo/add", #""milk""#, "payload of todo/add: expected an object, found a string"),
        ("todo/tagged", #"{"items":[{"name":"a","count":1},{"name":"b"}],"kind":"a"}"#, "payload of todo/tagged: field 'items[1].count' is missing"),
        ("todo/tagged", #"{"items":{},"kind":"a"}"#, "payload of todo/tagged: field 'items': expected an array, found an object"),
        ("todo/tagged", #"{"items":[],"kind":"c"}"#, "payload of todo/tagged: field 'kind': 'c' is not an accepted value"),
    ])
    func badPayloadMessagesAreReadable(type: String, payload: String, message: String) async throws {
        let bus = InMemoryBus()
        let running = try await bus.start(strictStore())
        let client = try await bus.client()
        let settlement = try await client.dispatchAndSettle(type: type, payloadJSON: Array(payload.utf8))
        guard case .rejected(let code, let text) = try only(settlement) else {
            Issue.record("not rejected: \(settlement)")
            return
        }
        #expect(code == "store/bad-payload")
        #expect(text == message)
        #expect(!text.contains("CodingKeys") && !text.contains("DecodingError"), "\(text)")
        try await running.stop()
    }

    @Test("errors thrown by handlers become store/error with a readable message")
    func handlerErrorsAreReadable() async throws {
        let bus = InMemoryBus()
        let running = try await bus.start(strictStore())
        let client = try await bus.client()
        #expect(try only(try await client.dispatchAndSettle(type: "todo/describe"))
                == .rejected(code: "store/error", message: "the disk is full"))
        #expect(try only(try await client.dispatchAndSettle(type: "todo/explode"))
                == .rejected(code: "store/error", message: "the handler failed (Boom)"))
        try await running.stop()
    }

    @Test("errors no one answers go to the store's Logger (not stderr) unless onError is set")
    func storeErrorsGoToTheLogger() async throws {
        let lines = Recorder<String>()
        let logger = Logger(label: "store-under-test") { _ in CapturingLogHandler(lines) }
        let store = strictStore(logger: logger)
        store.on("todo/later") { _, ctx in
            ctx.spawn { _ in throw StoreRejection(code: "todo/late", message: "spawned work failed") }
        }
        let bus = InMemoryBus()
        let running = try await bus.start(store)
        let client = try await bus.client()
        _ = try await client.dispatchAndSettle(type: "todo/later")
        let logged = try await lines.wait("the error logged") { $0.contains { $0.contains("spawned work failed") } }
        #expect(logged.contains { $0.hasPrefix("error ") })
        try await running.stop()
    }
}

/// A swift-log handler that records `level message` lines.
struct CapturingLogHandler: LogHandler {
    let lines: Recorder<String>
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    init(_ lines: Recorder<String>) { self.lines = lines }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        lines.append("\(event.level) \(event.message)")
    }
}
