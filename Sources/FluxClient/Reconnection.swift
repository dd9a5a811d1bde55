import FluxCore
import Foundation
import Synchronization

/// How a `FluxClient` (and a `FluxStore`) reconnects after losing fluxd (SPEC §15.5): after the connection drops
/// unexpectedly or fluxd says `bye` (shutdown, restart), never after `close()`.
///
/// Attempt *n* waits `initialDelay × 2^(n−1)`, at most `maxDelay`, each delay shortened by a random part of up to
/// `jitter` (so peers of one fluxd do not come back in lock step), then connects and says `hello` with the same
/// session. Reconnection goes on until it succeeds, unless `maxAttempts` or `giveUpAfter` ends it: then the client
/// ends as if the connection had dropped with reconnection off (`FluxError.disconnected`).
public struct ReconnectPolicy: Sendable, Equatable {
    /// Whether the client reconnects at all.
    public var enabled: Bool
    /// The delay before the first attempt.
    public var initialDelay: Duration
    /// The longest delay between attempts.
    public var maxDelay: Duration
    /// The largest fraction (0 … 1) of each delay taken off at random.
    public var jitter: Double
    /// Give up after this many attempts (nil: never).
    public var maxAttempts: Int?
    /// Give up once this long has passed since the connection was lost (nil: never).
    public var giveUpAfter: Duration?

    /// A policy; the defaults are `ReconnectPolicy.default`'s (`jitter` is clamped to 0 … 1).
    public init(enabled: Bool = true, initialDelay: Duration = .milliseconds(50), maxDelay: Duration = .seconds(2),
                jitter: Double = 0.25, maxAttempts: Int? = nil, giveUpAfter: Duration? = nil) {
        self.enabled = enabled
        self.initialDelay = initialDelay
        self.maxDelay = maxDelay
        self.jitter = min(max(jitter, 0), 1)
        self.maxAttempts = maxAttempts
        self.giveUpAfter = giveUpAfter
    }

    /// A connection lost within this time of its welcome is a quick loss: the reconnection after it continues
    /// the backoff of the quick losses before it (see `FluxClient`'s state).
    public static let quickLoss: Duration = .seconds(5)

    /// SPEC §16.6's wait after the `n`-th refusal in a row (n ≥ 1): a random time between d/2 and d,
    /// d = min(30 s, 100 ms × 2^(n−1)).
    public static func refusalDelay(after n: Int) -> Duration {
        let d = min(30_000.0, 100.0 * pow(2.0, Double(max(0, min(n, 20) - 1))))
        return .milliseconds(Double.random(in: (d / 2)...d))
    }

    /// Reconnect with the default backoff (50 ms doubling up to 2 s, jitter 25 %), forever.
    public static let `default` = ReconnectPolicy()
    /// Never reconnect: a lost connection ends the client (the behaviour before fluxd 0.3).
    public static let disabled = ReconnectPolicy(enabled: false)

    /// The delay before attempt `attempt` (1-based), jitter included.
    public func delay(forAttempt attempt: Int) -> Duration {
        var delay = initialDelay
        var n = 1
        while n < attempt && delay < maxDelay {
            delay = delay * 2
            n += 1
        }
        delay = min(delay, maxDelay)
        guard jitter > 0 else { return delay }
        return delay * (1 - Double.random(in: 0...jitter))
    }
}

/// What a client (or store) tells a UI about its connection to fluxd (`FluxClient.connectivityEvents()`,
/// `FluxStore.connectivityEvents()`): show "offline, reconnecting…" between `disconnected` and `reconnected`.
public enum ConnectivityEvent: Sendable, Equatable, CustomStringConvertible {
    /// The connection was lost (`reason` says how: dropped, or fluxd's `bye`); the client reconnects.
    case disconnected(reason: FluxError)
    /// Attempt number `attempt` starts after `delay`.
    case reconnecting(attempt: Int, delay: Duration)
    /// Connected again; subscriptions, queries and pending settlements were taken up again (and stores
    /// re-register). `epochChanged`: fluxd's history is not the one before (an ephemeral or older fluxd, or a new
    /// data directory): versions and seqs start over, and settlements pending then are lost ("outcome unknown").
    case reconnected(epochChanged: Bool)
    /// Reconnection stopped (`ReconnectPolicy.maxAttempts` or `giveUpAfter`); the client has ended with `error`.
    case gaveUp(FluxError)

    public var description: String {
        switch self {
        case .disconnected(let reason): return "disconnected (\(reason))"
        case .reconnecting(let attempt, let delay): return "reconnecting (attempt \(attempt) in \(delay.formatted))"
        case .reconnected(let changed): return changed ? "reconnected (fluxd's history changed)" : "reconnected"
        case .gaveUp(let error): return "gave up reconnecting (\(error))"
        }
    }
}

/// Hands `ConnectivityEvent`s to any number of `AsyncStream`s (a UI, a log), each keeping its newest 64 unread.
package final class ConnectivityBroadcaster: Sendable {
    private let state = Mutex<(next: Int, streams: [Int: AsyncStream<ConnectivityEvent>.Continuation], ended: Bool)>(
        (0, [:], false))

    package init() {}

    /// A new stream of the events from now on; finishes when `finish()` is called (at once if it was).
    package func stream() -> AsyncStream<ConnectivityEvent> {
        let (stream, continuation) = AsyncStream.makeStream(of: ConnectivityEvent.self, bufferingPolicy: .bufferingNewest(64))
        let id = state.withLock { s -> Int? in
            if s.ended { return nil }
            s.next += 1
            s.streams[s.next] = continuation
            return s.next
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in _ = self?.state.withLock { $0.streams.removeValue(forKey: id) } }
        return stream
    }

    /// Hands `event` to every stream (with no lock held).
    package func yield(_ event: ConnectivityEvent) {
        let streams = state.withLock { Array($0.streams.values) }
        for s in streams { s.yield(event) }
    }

    /// Ends every stream; with `permanently`, also those made later (else later ones get later events).
    package func finish(permanently: Bool = true) {
        let streams = state.withLock { s -> [AsyncStream<ConnectivityEvent>.Continuation] in
            if permanently { s.ended = true }
            defer { s.streams = [:] }
            return Array(s.streams.values)
        }
        for s in streams { s.finish() }
    }
}

/// A random session id (SPEC §15.4): the same on every connection of one client, so fluxd can hand it the outcome
/// of its earlier dispatches.
func makeSessionID() -> String {
    var g = SystemRandomNumberGenerator()
    let a = g.next() as UInt64, b = g.next() as UInt64
    return "s-" + String(a, radix: 16) + "-" + String(b, radix: 16)
}

// Reconnecting (SPEC §15.5): the state machine's other half. `handleClosed` moves a ready client to
// `.reconnecting` and calls `lost`; the task it starts makes attempts with backoff until one says hello and is
// welcomed (`resume`), the client is closed, or the policy gives up (`finish`).
extension FluxClient {
    /// The connection was lost and the client reconnects (`handleClosed` moved it to `.reconnecting`): the calls
    /// in flight that cannot be recovered (`failing`) fail, stores hear they are interrupted, the UI hears
    /// `disconnected`, and the reconnection task starts.
    func lost(_ reason: FluxError, failing: [String], sinks: [@Sendable (StoreInbound) -> Void]) {
        logger.notice("connection to fluxd lost (\(reason)); reconnecting")
        for key in failing {
            complete(key, .failure(.disconnected("\(reason.description.dropPrefix("disconnected: ")) while waiting for the answer")))
        }
        for sink in sinks { sink(.interrupted(reason)) }
        connectivity.yield(.disconnected(reason: reason))
        // A connection lost soon after its welcome (fluxd refused what the client did first, say) continues the
        // backoff of the losses before it; one that lasted starts over.
        let skip = state.withLock { s -> Int in
            if let at = s.welcomedAt, ContinuousClock().now - at < ReconnectPolicy.quickLoss {
                s.quickLosses += 1
            } else {
                s.quickLosses = 0
            }
            s.welcomedAt = nil
            // (One quick loss is a restart like any other; the second in a row is a pattern.)
            return max(0, s.quickLosses - 1)
        }
        if skip > 0 {
            logger.notice("connection to fluxd lost \(skip + 1) times in a row within \(ReconnectPolicy.quickLoss) of being welcomed; backing off")
        }
        let task = Task { [weak self] in
            guard let self else { return }
            await self.reconnectLoop(after: reason, skipping: skip)
        }
        let keep = state.withLock { s -> Bool in
            guard s.phase == .reconnecting else { return false }
            s.reconnectTask = task
            return true
        }
        if !keep { task.cancel() }
    }

    private func reconnectLoop(after reason: FluxError, skipping: Int) async {
        let policy = reconnect
        let clock = ContinuousClock()
        let start = clock.now
        var attempt = 0
        // (The delays continue those of the quick losses before; the attempts are counted from 1 as usual.)
        func delay(_ attempt: Int) -> Duration {
            let usual = policy.delay(forAttempt: attempt + skipping)
            guard skipping > 0 else { return usual }
            return max(usual, ReconnectPolicy.refusalDelay(after: skipping + attempt - 1))
        }
        var last = reason
        while state.withLock({ $0.phase == .reconnecting }) {
            attempt += 1
            let delay = delay(attempt)
            if let max = policy.maxAttempts, attempt > max {
                return giveUp(after: attempt - 1, last)
            }
            if let limit = policy.giveUpAfter, clock.now - start + delay > limit {
                return giveUp(after: attempt - 1, last)
            }
            connectivity.yield(.reconnecting(attempt: attempt, delay: delay))
            do {
                try await Task.sleep(for: delay)
            } catch {
                return  // Closed meanwhile.
            }
            do {
                try await reconnectOnce()
                return
            } catch {
                last = error
                logger.debug("reconnection attempt \(attempt) failed: \(error)")
            }
        }
    }

    private func giveUp(after attempts: Int, _ last: FluxError) {
        guard state.withLock({ $0.phase == .reconnecting }) else { return }
        let error = FluxError.disconnected("gave up reconnecting to fluxd after \(attempts) attempt(s); last: \(last)")
        logger.warning("\(error)")
        connectivity.yield(.gaveUp(error))
        finish(local: false, terminal: error)
    }

    /// One attempt: a new connection, `hello` with the session, `welcome`, then `resume`.
    private func reconnectOnce() async throws(FluxError) {
        guard let connector else { throw .closed }
        let connection = try await connector()
        let generation = state.withLock { s -> Int? in
            guard s.phase == .reconnecting else { return nil }
            s.generation += 1
            s.connection = connection
            s.pending[Self.helloKey] = .registered
            return s.generation
        }
        guard let generation else {
            connection.close()
            throw .closed
        }
        connection.start { [self] event in receive(event, generation: generation) }
        let reply: Envelope
        do {
            try connection.send(helloFrame().wireBytes)
            reply = try await awaitAnswer(key: Self.helloKey, deadline: .now + requestTimeout, limit: requestTimeout,
                                          what: "fluxd's welcome (reconnecting)")
        } catch {
            _ = state.withLock { $0.pending.removeValue(forKey: Self.helloKey) }
            connection.close()
            throw error
        }
        guard let welcome = Self.parseWelcome(reply) else {
            connection.close()
            throw .protocolViolation("expected welcome, got \(String(decoding: reply.body, as: UTF8.self))")
        }
        guard resume(with: welcome, generation: generation) else {
            connection.close()
            throw .closed
        }
    }

    /// Connected again: subscribe again, declare the live queries again, `recover` the settlements awaited, then
    /// send what was held; stores hear `resumed` and the UI `reconnected`. False if the client was closed meanwhile.
    private func resume(with welcome: Welcome, generation: Int) -> Bool {
        let lostOutcome = FluxError.disconnected(
            "the connection to fluxd was lost before the settlement arrived, and fluxd's history is not the one the "
                + "action was dispatched to (another epoch): the outcome is unknown")
        let plan = state.withLock { s -> (changed: Bool, lost: [String], sinks: [@Sendable (StoreInbound) -> Void])? in
            guard s.phase == .reconnecting else { return nil }
            let before = s.welcome?.epoch
            // A missing epoch is an older fluxd, which keeps nothing across restarts: a changed history.
            let changed = welcome.epoch == nil || before == nil || welcome.epoch != before
            s.welcome = welcome
            s.welcomedAt = ContinuousClock().now
            s.phase = .ready
            if changed { s.era += 1 }
            var out: [UInt8] = []
            for store in s.subscriptions.keys.sorted() {
                if changed {
                    s.subscriptions[store]?.version = 0
                    s.subscriptions[store]?.delivered = 0
                    s.subscriptions[store]?.latest = nil
                }
                // Within one epoch, a delta subscription resumes from the version its subscribers hold (§16.3).
                s.subscriptions[store]?.resyncing = false
                let from = changed ? nil : s.subscriptions[store]?.delivered
                out.append(contentsOf: Self.subscribeFrame(store: store, deltas: s.deltas, from: from).wireBytes)
            }
            out.append(contentsOf: Self.resubscribePaths(&s, epochChanged: changed))
            for (id, query) in s.liveQueries.sorted(by: { $0.key < $1.key }) {
                var b = FrameBuilder(op: "query", capacity: 64 + query.query.count)
                b.string("id", id)
                b.string("store", query.store)
                b.raw("query", query.query)
                out.append(contentsOf: b.finish().wireBytes)
            }
            let heldKeys = Set(s.held.compactMap { $0.key })
            let sent = s.settles.subtracting(heldKeys).sorted()
            var lost: [String] = []
            if changed {
                lost = sent
            } else {
                var rest = sent[...]
                while !rest.isEmpty {
                    let chunk = Array(rest.prefix(4096))
                    rest = rest.dropFirst(chunk.count)
                    s.nextID += 1
                    let id = "v#\(s.nextID)"
                    s.recovering[id] = chunk
                    var b = FrameBuilder(op: "recover")
                    b.string("id", id)
                    b.strings("ids", chunk)
                    out.append(contentsOf: b.finish().wireBytes)
                }
            }
            for frame in s.held { out.append(contentsOf: frame.bytes) }
            s.held = []
            s.outbox = out + s.outbox
            return (changed, lost, Array(s.sinks.values))
        }
        guard let plan else { return false }
        logger.notice("reconnected to \(welcome.server) as peer \(welcome.peer)\(plan.changed ? " (another epoch)" : "")")
        for id in plan.lost { complete(id, .failure(lostOutcome)) }
        try? flush()
        for sink in plan.sinks { sink(.resumed(generation: generation, epochChanged: plan.changed)) }
        connectivity.yield(.reconnected(epochChanged: plan.changed))
        return true
    }
}

extension String {
    /// The string without `prefix`, when it starts with it.
    fileprivate func dropPrefix(_ prefix: String) -> String {
        hasPrefix(prefix) ? String(dropFirst(prefix.count)) : self
    }
}
