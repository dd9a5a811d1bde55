import FluxRouter
import FluxTransport
import Logging

/// Accept failures (a connection fluxd could not take: `EMFILE`, `ENFILE`, ...): counted in total and by errno
/// name, and logged at most once per `interval` — the first failure at once, later ones within the interval only
/// counted, and the next line after it says how many were suppressed since the last one (like the kernel's
/// `printk_ratelimited`). Pure: the caller passes the time.
struct AcceptFailureLog {
    /// What to log for one failure that is not suppressed.
    struct Report: Equatable {
        /// The errno name of this failure (`EMFILE`).
        var name: String
        /// Failures not logged since the previous line, and their errno names.
        var suppressed: UInt64
        var suppressedByName: [String: UInt64]
        /// Every failure so far, this one included.
        var total: UInt64
    }

    let interval: Millis
    private(set) var total: UInt64 = 0
    private(set) var counts: [String: UInt64] = [:]
    private var lastLogged: Millis?
    private var suppressed: UInt64 = 0
    private var suppressedByName: [String: UInt64] = [:]

    init(interval: Millis = 1000) {
        self.interval = interval
    }

    /// Counts one failure with errno name `name` at `now` (ms); the report to log, or nil when it is suppressed.
    mutating func record(_ name: String, now: Millis) -> Report? {
        total += 1
        counts[name, default: 0] += 1
        if let last = lastLogged, now &- last < interval {
            suppressed += 1
            suppressedByName[name, default: 0] += 1
            return nil
        }
        lastLogged = now
        defer {
            suppressed = 0
            suppressedByName = [:]
        }
        return Report(name: name, suppressed: suppressed, suppressedByName: suppressedByName, total: total)
    }
}

extension AcceptFailureLog.Report {
    /// The log line's metadata for `error` (this report's failure).
    func metadata(_ error: UVError) -> Logger.Metadata {
        var metadata: Logger.Metadata = ["error": "\(error.message) (\(error.name))", "operation": "\(error.operation)",
                                         "total": "\(total)"]
        if suppressed > 0 {
            metadata["suppressed"] = "\(suppressed)"
            metadata["suppressed_by_error"] = "\(suppressedByName.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ","))"
        }
        return metadata
    }
}

extension Daemon {
    /// Connections fluxd could not accept since it started (all causes; `acceptErrorCounts` by errno name).
    public var acceptErrorCount: UInt64 { acceptFailures.total }

    /// Accept failures by errno name (`"EMFILE"`, `"ENFILE"`, ...).
    public var acceptErrorCounts: [String: UInt64] { acceptFailures.counts }
}
