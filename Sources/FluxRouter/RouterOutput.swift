import FluxCore

/// Counters reported by `info`.
public struct Counters: Sendable {
    /// Connections, frames, bytes, actions and snapshots.
    public var traffic = Traffic()
    /// Errors sent, by code.
    public var errors: [String: UInt64] = [:]

    mutating func count(_ code: ErrorCode) { errors[code.rawValue, default: 0] += 1 }

    /// The fields of `info.counters`.
    func write(to c: inout JSONBuilder) {
        c.field("connections", traffic.connections)
        c.field("framesIn", traffic.framesIn)
        c.field("framesOut", traffic.framesOut)
        c.field("bytesIn", traffic.bytesIn)
        c.field("bytesOut", traffic.bytesOut)
        c.field("actions", traffic.actions)
        c.field("snapshots", traffic.snapshots)
        c.object("errors") { e in
            for key in errors.keys.sorted() { e.field(named: key, errors[key]!) }
        }
    }
}

/// The effects being produced by one event, and the traffic they count (added to `Router.counters` when the
/// event is done: plain integers here, so building an `Output` per event copies no dictionary).
struct Output {
    /// The effects, in order, when there is no sink.
    var effects: [RouterEffect]
    /// Carries the effects out as they come instead (the caller of `handle(_:now:sink:)` keeps it alive).
    unowned(unsafe) let sink: (any RouterEffectSink)?
    /// The sink when it is a `DaemonCore` (`Router.handle(_:now:core:)`), called at +0 and without a witness: a
    /// call through the `unowned(unsafe)` existential retained and released the core for every frame (issue 27).
    let core: Unmanaged<DaemonCore>?
    var traffic = Traffic()

    /// Whether `.debug` log effects are made at all (their text costs more than the rest of a refused request).
    let debugLogs: Bool

    init(effects: [RouterEffect], sink: (any RouterEffectSink)?, core: DaemonCore? = nil, debugLogs: Bool) {
        self.effects = effects
        self.sink = sink
        self.core = core.map { Unmanaged.passUnretained($0) }
        self.debugLogs = debugLogs
    }

    /// Queues a frame to a peer; a peer that is closing gets nothing more.
    mutating func send(_ peer: Peer, _ frame: Frame) {
        guard !peer.closing else { return }
        traffic.framesOut += 1
        traffic.bytesOut += UInt64(frame.bytes.count)
        if let core {
            core._withUnsafeGuaranteedRef { $0.send(frame, to: peer.id) }
        } else if let sink {
            sink.send(frame, to: peer.id)
        } else {
            effects.append(.send(peer.id, frame))
        }
    }

    /// Whether `peer`'s connection is behind (SPEC §16.3); never without a sink (effects collected for a test).
    func isBehind(_ peer: Peer) -> Bool {
        if let core { return core._withUnsafeGuaranteedRef { $0.isBehind(peer.id) } }
        return sink?.isBehind(peer.id) ?? false
    }

    mutating func log(_ level: LogLevel, _ message: @autoclosure () -> String) {
        if level == .debug && !debugLogs { return }
        append(.log(level, message()))
    }

    mutating func append(_ effect: RouterEffect) {
        if let core {
            core._withUnsafeGuaranteedRef { $0.perform(effect) }
        } else if let sink {
            sink.perform(effect)
        } else {
            effects.append(effect)
        }
    }
}

/// Traffic counters: plain integers, so an event counts into its own `Traffic` (in `Output`) and adds it to the
/// router's counters once, without copying the errors dictionary per event.
public struct Traffic: Sendable {
    /// The counters, one lane each (the last unused): an event's traffic is added to the totals in one vector
    /// add, not seven checked ones (issue 27). They wrap at 2^64 instead of trapping.
    private var lanes = SIMD8<UInt64>()

    public init() {}

    public var connections: UInt64 { get { lanes[0] } set { lanes[0] = newValue } }
    public var framesIn: UInt64 { get { lanes[1] } set { lanes[1] = newValue } }
    public var framesOut: UInt64 { get { lanes[2] } set { lanes[2] = newValue } }
    public var bytesIn: UInt64 { get { lanes[3] } set { lanes[3] = newValue } }
    public var bytesOut: UInt64 { get { lanes[4] } set { lanes[4] = newValue } }
    public var actions: UInt64 { get { lanes[5] } set { lanes[5] = newValue } }
    public var snapshots: UInt64 { get { lanes[6] } set { lanes[6] = newValue } }

    mutating func add(_ t: Traffic) { lanes &+= t.lanes }
}

/// At most `perWindow` log lines of one kind per `window` ms; the first line after a window with suppressed ones
/// says how many were left out. Every log line a peer can cause once per frame or per connection goes through one
/// (`Router.logLimited`): the log is shared by every peer, and writing it costs the loop a `write` per line.
struct LogRateLimit {
    static let window: Millis = 10_000
    static let perWindow = 5
    enum Admission { case log(suppressed: Int), suppress }

    private var windowStart: Millis = 0
    private var logged = 0
    private var suppressed = 0

    mutating func admit(now: Millis) -> Admission {
        if now >= windowStart + Self.window {
            windowStart = now
            logged = 0
        }
        guard logged < Self.perWindow else {
            suppressed += 1
            return .suppress
        }
        logged += 1
        defer { suppressed = 0 }
        return .log(suppressed: suppressed)
    }
}
