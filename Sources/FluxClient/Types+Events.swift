import FluxCore

/// JSON bytes exactly as fluxd forwarded them (a state, a payload), for tools that print or diff what a store sent
/// without decoding it into a type (`FluxClient.getJSON`, `FluxClient.subscribeJSON`).
public struct RawJSON: Sendable, Equatable, CustomStringConvertible {
    /// The bytes (one valid JSON value).
    public var bytes: [UInt8]

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// The bytes as text.
    public var description: String { String(decoding: bytes, as: UTF8.self) }
}

/// Where a subscribed store stands, as fluxd last reported it to this subscription (`subscribed`, `store-down`,
/// `store-up`, and the versions of its snapshots).
public struct SubscriptionStatus: Sendable, Equatable, CustomStringConvertible {
    /// The store's name.
    public var store: String
    /// `up`, `down`, or `unknown`: no store of that name has registered yet (clients may start before stores; the
    /// subscription stays in place and the store's snapshots arrive once it registers).
    public var status: StoreStatus
    /// The newest version reported (0: no snapshot yet).
    public var version: Int
    /// Why the store went down, while it is down.
    public var downReason: String?

    public init(store: String, status: StoreStatus, version: Int, downReason: String? = nil) {
        self.store = store
        self.status = status
        self.version = version
        self.downReason = downReason
    }

    /// For a person: `up (version 3)`, `down (disconnected), version 3`, `no store named 'x' has registered yet`.
    public var description: String {
        switch status {
        case .up: return "up (version \(version))"
        case .down: return "down (\(downReason ?? "unknown reason")), version \(version)"
        case .unknown: return "no store named '\(store)' has registered yet"
        }
    }
}

/// One supervised store worker (fluxd as a plugin host, SPEC §8.11: `FluxClient.workers()`).
public struct Worker: Sendable, Equatable {
    /// A worker's state. Receivers must accept states they do not know (`other`).
    public enum State: Sendable, Equatable, Hashable, CustomStringConvertible {
        /// Waiting for its dependencies, or started and not yet registered its stores.
        case starting
        /// Its stores are up.
        case running
        /// Ended; restarts after a delay.
        case backingOff
        /// SIGTERM sent.
        case stopping
        /// Stopped until restarted.
        case stopped
        /// Given up on (restart intensity reached, or the command cannot be started).
        case failed
        /// A state this SDK does not know (a newer fluxd).
        case other(String)

        /// The wire spelling.
        public init(wire: String) {
            switch wire {
            case "starting": self = .starting
            case "running": self = .running
            case "backing-off": self = .backingOff
            case "stopping": self = .stopping
            case "stopped": self = .stopped
            case "failed": self = .failed
            default: self = .other(wire)
            }
        }

        /// The wire spelling (`backing-off`, ...).
        public var description: String {
            switch self {
            case .starting: return "starting"
            case .running: return "running"
            case .backingOff: return "backing-off"
            case .stopping: return "stopping"
            case .stopped: return "stopped"
            case .failed: return "failed"
            case .other(let s): return s
            }
        }
    }

    /// How the worker's last process ended.
    public enum Exit: Sendable, Equatable {
        /// It exited with this status.
        case code(Int)
        /// It was killed by this signal (`SIGKILL`, ...).
        case signal(String)
    }

    /// The worker's name in fluxd's config file.
    public var name: String
    /// Its state.
    public var state: State
    /// The running process, if any.
    public var pid: Int?
    /// Restarts by the supervisor since fluxd started.
    public var restarts: Int
    /// Since the current process was started, in milliseconds (nil when none runs).
    public var uptimeMilliseconds: Int?
    /// How the last process ended, if one did.
    public var lastExit: Exit?
    /// The stores it is expected to register.
    public var stores: [String]
    /// Why it failed or was last restarted.
    public var error: String?
    /// The worker object exactly as fluxd sent it (for tools that show fields this type does not model).
    public var json: [UInt8]

    public init(name: String, state: State, pid: Int? = nil, restarts: Int = 0, uptimeMilliseconds: Int? = nil,
                lastExit: Exit? = nil, stores: [String] = [], error: String? = nil, json: [UInt8] = []) {
        self.name = name
        self.state = state
        self.pid = pid
        self.restarts = restarts
        self.uptimeMilliseconds = uptimeMilliseconds
        self.lastExit = lastExit
        self.stores = stores
        self.error = error
        self.json = json
    }

    /// Reads one worker object of a `workers` or `worker` reply.
    init(object bytes: ArraySlice<UInt8>) throws(FluxError) {
        let env: Envelope
        do {
            env = try Envelope(body: Array(bytes))
        } catch {
            throw .protocolViolation("a worker is not an object: \(String(decoding: bytes, as: UTF8.self))")
        }
        guard let name = env.fluxString("name"), let state = env.fluxString("state") else {
            throw .protocolViolation("a worker without name or state: \(String(decoding: bytes, as: UTF8.self))")
        }
        var exit: Exit?
        if let raw = env.raw("last_exit"), let inner = try? Envelope(body: Array(raw)) {
            if let code = inner.fluxInt("code") { exit = .code(code) } else if let signal = inner.fluxString("signal") { exit = .signal(signal) }
        }
        self.init(name: name, state: State(wire: state), pid: env.fluxInt("pid"), restarts: env.fluxInt("restarts") ?? 0,
                  uptimeMilliseconds: env.fluxInt("uptime_ms"), lastExit: exit,
                  stores: env.stringArray("stores").value ?? [], error: env.fluxString("error"), json: Array(bytes))
    }
}

/// One event of fluxd's monitor stream (SPEC §8.10; a client connected with role `monitor` receives them:
/// `FluxClient.monitorEvents()`).
public struct MonitorEvent: Sendable {
    /// What happened: `dispatch`, `settle`, `snapshot`, `store-up`, `store-down`, `connect`, `disconnect`, `error`
    /// (receivers must accept kinds they do not know), or `missed` when fluxd (or this SDK's buffer) dropped
    /// events because they were not read fast enough: `missed` then says how many.
    public var kind: String
    /// The event object as fluxd sent it, `op` included (`{"op":"event","kind":...,"t":...,...}`).
    public var message: Envelope

    /// Milliseconds since fluxd started (`t`).
    public var time: Int? { message.fluxInt("t") }
    /// The action's seq (dispatch, settle, snapshot).
    public var seq: Int? { message.fluxInt("seq") }
    /// The store concerned (snapshot, store-up, store-down).
    public var store: String? { message.fluxString("store") }
    /// The action type (dispatch).
    public var type: String? { message.fluxString("type") }
    /// How many events were dropped (`missed`).
    public var missed: Int? { kind == "missed" ? message.fluxInt("count") : nil }
}
