/// fluxd's global memory budget: the bytes it accounts for, shared fairly between users and connections.
///
/// What is counted (not RSS, which the allocator keeps after frees): each connection's unfinished frame and the
/// frames waiting to be written to it (reported by the transport), the actions it dispatched until they settle,
/// its live queries and subscriptions (charged by the router), and every store's retained snapshot (charged to
/// the user that published it, since it outlives the connection).
///
/// The rules, in the manner of dbus-broker's per-UID accounting:
/// - every open connection holds an **allowance** (`Limits.connectionAllowance`) reserved when it connects:
///   what it uses within that costs nothing more, so a well-behaved peer (small frames, a few actions in flight)
///   is never refused, however much others take;
/// - use above the allowance comes from the shared pool: refused when it would take the total over
///   `Limits.total`, or its user's total (allowances included) over `Limits.perUser`;
/// - so at every moment `used` = Σ over connections of max(use, allowance) + Σ retained snapshots
///   ≤ `Limits.total` (a connection that cannot reserve its allowance is refused at connect).
///
/// Pure bookkeeping (no I/O, no clock), owned by the router; the daemon reports transport bytes through
/// `Router.accountTransport(_:bytes:)`. Like the router, it lives on one thread and never re-enters itself, so its
/// stored properties are `@exclusivity(unchecked)` (dynamic exclusivity checks on them showed in the profile;
/// Benchmarks/PROFILE.md).
public final class MemoryBudget {
    /// The budget's limits (announced to peers in `welcome.limits`).
    public struct Limits: Sendable, Equatable {
        /// Bytes fluxd accounts for in total.
        public var total: Int = 1 << 30
        /// Bytes one user (uid) may hold: its connections' allowances and use above them, and its stores'
        /// retained snapshots.
        public var perUser: Int = 256 << 20
        /// Bytes each open connection may use without drawing on the shared pool (reserved at connect).
        public var connectionAllowance: Int = 64 << 10

        public init() {}
    }

    /// One connection's account (or a user's account for what outlives connections: retained snapshots).
    public final class Account {
        /// The user it is charged to (`UInt32.max` when the kernel did not say).
        public let uid: UInt32
        /// Bytes the transport holds for it (unfinished frame, unwritten frames), as last reported.
        @exclusivity(unchecked) public fileprivate(set) var transport = 0
        /// Bytes the router holds for it (unsettled dispatches, queries, subscriptions, snapshots).
        @exclusivity(unchecked) public fileprivate(set) var held = 0
        /// The allowance reserved while the connection is open (0 once closed, and for user accounts).
        @exclusivity(unchecked) public fileprivate(set) var reserved: Int

        init(uid: UInt32, reserved: Int) {
            self.uid = uid
            self.reserved = reserved
        }

        /// What the account counts against the budget.
        public var footprint: Int { max(transport + held, reserved) }
    }

    public let limits: Limits
    /// Bytes accounted for now (see the type's rules) and the most ever.
    @exclusivity(unchecked) public private(set) var used = 0
    @exclusivity(unchecked) public private(set) var peak = 0
    /// Charges refused so far.
    @exclusivity(unchecked) public private(set) var refusals: UInt64 = 0
    /// Bytes accounted per user.
    @exclusivity(unchecked) public private(set) var byUser: [UInt32: Int] = [:]

    public init(limits: Limits = Limits()) {
        self.limits = limits
    }

    /// Opens a connection's account, reserving its allowance; nil when the total or the user's share has no room
    /// for it.
    public func open(uid: UInt32) -> Account? {
        let allowance = limits.connectionAllowance
        guard fits(uid, allowance) else {
            refusals += 1
            return nil
        }
        let account = Account(uid: uid, reserved: allowance)
        apply(uid, allowance)
        return account
    }

    /// An account that holds no allowance (a user's retained snapshots).
    public func userAccount(uid: UInt32) -> Account { Account(uid: uid, reserved: 0) }

    /// The connection closed: its allowance and transport bytes are returned; what it still holds (unsettled
    /// dispatches) stays charged until released.
    public func close(_ account: Account) {
        let before = account.footprint
        account.reserved = 0
        account.transport = 0
        apply(account.uid, account.footprint - before)
    }

    /// Charges `bytes` more to the router's part of `account`; false (nothing charged) when that would take the
    /// total or the user over the limit.
    @inline(__always)
    public func charge(_ account: Account, _ bytes: Int) -> Bool {
        let after = account.transport + account.held + bytes
        if after <= account.reserved {  // within the allowance: the common case
            account.held += bytes
            return true
        }
        return chargeAbove(account, bytes)
    }

    private func chargeAbove(_ account: Account, _ bytes: Int) -> Bool {
        let before = account.footprint
        let delta = max(account.transport + account.held + bytes, account.reserved) - before
        guard fits(account.uid, delta) else {
            refusals += 1
            return false
        }
        account.held += bytes
        apply(account.uid, delta)
        return true
    }

    /// Changes a charge of `old` bytes into one of `new` bytes; false (nothing changed) when a growth does not fit.
    @inline(__always)
    public func resize(_ account: Account, from old: Int, to new: Int) -> Bool {
        if new >= old { return charge(account, new - old) }
        release(account, old - new)
        return true
    }

    /// Returns `bytes` charged earlier with `charge` (or `force`).
    @inline(__always)
    public func release(_ account: Account, _ bytes: Int) {
        let before = account.transport + account.held
        account.held -= bytes
        if before <= account.reserved { return }  // was within the allowance: nothing moved
        let after = max(account.transport + account.held, account.reserved)
        apply(account.uid, after - max(before, account.reserved))
    }

    /// Charges `bytes` whatever the limits (for what cannot be refused once accepted).
    public func force(_ account: Account, _ bytes: Int) {
        let before = account.footprint
        account.held += bytes
        apply(account.uid, account.footprint - before)
    }

    /// Sets the transport's part of `account`; false (nothing changed) when a growth would take the total or the
    /// user over the limit. A shrink always succeeds.
    public func setTransport(_ account: Account, _ bytes: Int) -> Bool {
        let before = account.footprint
        let after = max(bytes + account.held, account.reserved)
        let delta = after - before
        if delta > 0 && !fits(account.uid, delta) {
            refusals += 1
            return false
        }
        account.transport = bytes
        apply(account.uid, delta)
        return true
    }

    /// The most `charge(account, _:)` would accept now: what is left of its allowance, plus the room the total and
    /// its user have (a charge within the allowance is free).
    public func headroom(_ account: Account) -> Int {
        let within = max(0, account.reserved - (account.transport + account.held))
        let room = min(limits.total - used, limits.perUser - (byUser[account.uid] ?? 0))
        return within + max(0, room)
    }

    /// Whether `delta` more bytes for `uid` stay within both limits.
    public func fits(_ uid: UInt32, _ delta: Int) -> Bool {
        if delta <= 0 { return true }
        return used + delta <= limits.total && (byUser[uid] ?? 0) + delta <= limits.perUser
    }

    private func apply(_ uid: UInt32, _ delta: Int) {
        if delta == 0 { return }
        used += delta
        if used > peak { peak = used }
        let now = (byUser[uid] ?? 0) + delta
        if now == 0 { byUser.removeValue(forKey: uid) } else { byUser[uid] = now }
    }
}
