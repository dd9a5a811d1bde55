import FluxCore

/// The dispatcher as a pure state machine (STUB: being written; signatures are final).
public final class Router {
    public let config: RouterConfig

    public init(config: RouterConfig = RouterConfig()) {
        self.config = config
    }

    /// Feeds one event; appends the effects to carry out, in order.
    public func handle(_ event: RouterEvent, now: Millis, into effects: inout [RouterEffect]) {}

    /// Convenience for tests: the effects of one event.
    public func handle(_ event: RouterEvent, now: Millis) -> [RouterEffect] {
        var effects: [RouterEffect] = []
        handle(event, now: now, into: &effects)
        return effects
    }

    /// The earliest time at which a `tick` has work to do (a handshake or queued action expiring), if any.
    public var nextDeadline: Millis? { nil }

    /// Whether every peer has been closed after `shutdown` (the daemon may stop its loop).
    public var isIdle: Bool { true }
}
