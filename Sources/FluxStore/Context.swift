import FluxClient
import FluxCore
import Foundation

/// A store's refusal of an action: throw it from a handler. The state is rolled back and fluxd is told
/// `reject` with this code (the store's own, e.g. `todo/not-found`) and message; the dispatcher sees it in its
/// `Settlement`. Any other error thrown by a handler is reported with code `store/error`.
public struct StoreRejection: Error, Sendable, Equatable, CustomStringConvertible {
    /// A stable, machine-readable code (conventionally `<domain>/<reason>`).
    public var code: String
    /// Human-readable text.
    public var message: String

    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    /// The code used when a payload does not decode as the handler's type.
    public static let badPayloadCode = "store/bad-payload"
    /// The code used for an action that matches the store's patterns but none of its handlers (the same code in
    /// the Swift, Python and Node store libraries).
    public static let unhandledActionCode = "store/unhandled-action"
    /// The code used for errors other than `StoreRejection` thrown by a handler.
    public static let errorCode = "store/error"

    public var description: String { "\(code): \(message)" }
}

/// What a store answers an action that matches its `handles` patterns but none of its handlers (e.g. `counter/ad`
/// under `counter/*`, a typo).
public enum UnhandledActions: Sendable, Equatable {
    /// Reject it with `store/unhandled-action` and a message naming the type and the handled types (the default:
    /// a typo must not look like success).
    case reject
    /// Answer it `done`, state unchanged (a store that deliberately takes a whole namespace and acts on part of it).
    case ignore
}

/// One active query of a query-driven store, decoded, with how many client queries share it.
public struct ActiveQuery<Query> {
    /// The decoded query.
    public var query: Query
    /// How many live client queries are equal to it (byte-equal JSON).
    public var count: Int

    public init(query: Query, count: Int) {
        self.query = query
        self.count = count
    }
}

extension ActiveQuery: Sendable where Query: Sendable {}
extension ActiveQuery: Equatable where Query: Equatable {}

/// Everything a handler may do besides mutating the state, valid only during the handler call.
///
/// Effects are transactional like the state: follow-up dispatches and spawned work requested by a handler take
/// effect only if the handler returns; they are sent/started right after the store's answer (`done`) or published
/// state. If the handler throws they are discarded with the state changes.
public class StoreContext {
    /// A dispatch waiting for the handler to return.
    struct FollowUp {
        var type: String
        var payload: [UInt8]?
        var cause: Int?
    }

    /// The store's name.
    public let storeName: String
    let followUpCause: Int?
    let followed: [String: any Sendable]
    // Unchecked: a context is used by one handler call, on the store's loop.
    @exclusivity(unchecked) var followUps: [FollowUp] = []
    @exclusivity(unchecked) var spawned: [@Sendable (StoreDispatcher) async throws -> Void] = []

    init(storeName: String, followUpCause: Int?, followed: [String: any Sendable]) {
        self.storeName = storeName
        self.followUpCause = followUpCause
        self.followed = followed
    }

    /// Dispatches a follow-up action after this handler returns (with `cause` = the action being handled,
    /// when there is one). Throws at once if the type is invalid or the payload does not encode.
    public func dispatch<P: Encodable>(_ type: String, payload: P) throws(FluxError) {
        guard Names.isValidType(type) else { throw .invalidArgument("bad action type \"\(type)\"") }
        followUps.append(FollowUp(type: type, payload: try FluxJSON.encode(payload), cause: followUpCause))
    }

    /// Dispatches a follow-up action without payload after this handler returns.
    public func dispatch(_ type: String) throws(FluxError) {
        guard Names.isValidType(type) else { throw .invalidArgument("bad action type \"\(type)\"") }
        followUps.append(FollowUp(type: type, payload: nil, cause: followUpCause))
    }

    /// Starts asynchronous work (a network fetch, a timer...) after this handler returns, without blocking the
    /// store: the next actions are handled meanwhile. The work cannot touch the state; it reports back by
    /// dispatching an action (`dispatcher.dispatch`), which the store then handles in order like any other.
    /// Work still running when the store stops is cancelled. Errors it throws go to the store's `onError`.
    public func spawn(_ work: @escaping @Sendable (StoreDispatcher) async throws -> Void) {
        spawned.append(work)
    }

    /// The latest snapshot of a store this store follows (see `FluxStore.follow`), if one arrived.
    /// With `waitFor` on that store, it already reflects the action being handled (protocol rule R3).
    public func latest<T>(_ store: String, as type: T.Type = T.self) -> Snapshot<T>? {
        followed[store] as? Snapshot<T>
    }
}

/// The context of an action handler: the action's identity, plus everything `StoreContext` offers.
public final class ActionContext: StoreContext {
    /// The action's global sequence number.
    public let seq: Int
    /// The action type.
    public let type: String
    /// The `action` message, whose other fields are read when a handler asks for them (most never do).
    let message: Envelope
    /// The peer id of the connection that dispatched it.
    public var origin: Int { message.fluxInt("origin") ?? 0 }
    /// The seq of the action whose handling led to this one, if the dispatcher said so.
    public var cause: Int? { message.int(.cause).value.map { Int($0) } }
    /// Whether fluxd delivered it before to a connection of this store that went down without answering.
    public var redelivered: Bool { message.bool("redelivered").value ?? false }

    init(storeName: String, seq: Int, type: String, message: Envelope, followed: [String: any Sendable]) {
        self.seq = seq
        self.type = type
        self.message = message
        super.init(storeName: storeName, followUpCause: seq, followed: followed)
    }
}

/// What spawned work (see `StoreContext.spawn`) uses to report back: dispatches carry `cause` = the action that
/// spawned the work. `client` is the store's connection, for anything else (subscribe, query, ...).
public struct StoreDispatcher: Sendable {
    /// The store's connection.
    public let client: FluxClient
    /// The seq of the action whose handler spawned this work (nil when spawned outside an action).
    public let cause: Int?

    /// Dispatches an action (fire-and-forget; a `no-handler` error goes to the store's `onError`).
    public func dispatch<P: Encodable>(_ type: String, payload: P) throws(FluxError) {
        try client.dispatch(type: type, payload: payload, cause: cause)
    }

    /// Dispatches an action without payload.
    public func dispatch(_ type: String) throws(FluxError) {
        try client.dispatch(type: type, cause: cause)
    }

    /// Dispatches an action and waits for its settlement. Do not wait for an action this same store must handle
    /// from inside a handler; from spawned work it is fine (the store keeps processing).
    public func dispatchAndSettle<P: Encodable>(_ type: String, payload: P) async throws(FluxError) -> Settlement {
        try await client.dispatchAndSettle(type: type, payload: payload, cause: cause)
    }
}
