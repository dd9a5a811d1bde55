import FluxCore
import Glibc
import Logging
import Synchronization

/// The log level and format every `FluxLogHandler` made with it follows, changed at once for all of them by a
/// config reload (docs/configuration.md).
public final class LogSettings: Sendable {
    private let state: Mutex<(level: Logger.Level, format: LogFormat)>

    public init(level: Logger.Level, format: LogFormat) {
        state = Mutex((level, format))
    }

    public var level: Logger.Level {
        get { state.withLock { $0.level } }
        set { state.withLock { $0.level = newValue } }
    }

    public var format: LogFormat {
        get { state.withLock { $0.format } }
        set { state.withLock { $0.format = newValue } }
    }
}

/// How fluxd writes its log lines (`--log-format`, docs/logging.md).
public enum LogFormat: String, Sendable, CaseIterable {
    /// For people: `TIME LEVEL LABEL: message key=value ...` (message first, metadata after it); under systemd's
    /// journal, `<PRIORITY>LABEL: message key=value ...` (journald adds the time and reads the level).
    case text
    /// For pipelines: one JSON object per line, `{"time","level","label","message","metadata":{...}}`.
    case json
}

/// fluxd's swift-log handler, and the SDKs' (`FluxLogging.bootstrap()`): one line per event, written to stderr with a single `write` (lines of concurrent
/// threads never interleave). `journald` (see `LogDestination.detect()`) drops the timestamp from text lines and
/// puts the syslog priority first (`<6>`, sd-daemon(3)), so the journal shows one time and the right level.
public struct FluxLogHandler: LogHandler {
    /// The level (shared with every handler of `settings` when there are settings).
    public var logLevel: Logger.Level {
        get { settings?.level ?? ownLevel }
        set { if let settings { settings.level = newValue } else { ownLevel = newValue } }
    }
    private var ownLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public let label: String
    /// The format (shared like the level).
    public var format: LogFormat { settings?.format ?? ownFormat }
    private let ownFormat: LogFormat
    private let settings: LogSettings?
    public let journald: Bool
    /// Whether text lines start with the time (false for a worker whose lines fluxd logs with its own time).
    public let timestamps: Bool
    /// Where a finished line goes (stderr; tests capture it).
    let write: @Sendable ([UInt8]) -> Void
    /// Now, in milliseconds since the epoch (tests fix it).
    let clock: @Sendable () -> Int64

    /// A handler to stderr following `settings` (fluxd's: a reload changes them).
    public init(label: String, settings: LogSettings, journald: Bool, timestamps: Bool = true) {
        self.init(label: label, level: settings.level, format: settings.format, journald: journald,
                  timestamps: timestamps, write: { line in writeAllToStderr(line) }, clock: { nowMillis() },
                  settings: settings)
    }

    /// A handler writing to `write` with the time from `clock` (tests).
    public init(label: String, level: Logger.Level, format: LogFormat, journald: Bool, timestamps: Bool = true,
                write: @escaping @Sendable ([UInt8]) -> Void, clock: @escaping @Sendable () -> Int64,
                settings: LogSettings? = nil) {
        self.timestamps = timestamps
        self.label = label
        self.ownLevel = level
        self.ownFormat = format
        self.settings = settings
        self.journald = journald
        self.write = write
        self.clock = clock
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { $1 } }
        write(Array(line(level: event.level, message: "\(event.message)", metadata: merged, source: event.source).utf8))
    }

    /// One line (with its newline) for an event.
    public func line(level: Logger.Level, message: String, metadata: Logger.Metadata, source: String) -> String {
        let keys = metadata.keys.sorted()
        switch format {
        case .text:
            var line = journald ? "<\(Self.priority(level))>\(label): "
                : timestamps ? "\(rfc3339(clock())) \(level) \(label): " : "\(level) \(label): "
            line += oneLine(message)
            for key in keys { line += " \(key)=\(textValue(metadata[key]!))" }
            return line + "\n"
        case .json:
            var line = "{\"time\":\"\(rfc3339(clock()))\",\"level\":\"\(level)\",\"label\":"
            line += jsonString(label) + ",\"message\":" + jsonString(message)
            if journald { line += ",\"priority\":\(Self.priority(level))" }
            if !keys.isEmpty {
                line += ",\"metadata\":{" + keys.map { jsonString($0) + ":" + jsonValue(metadata[$0]!) }.joined(separator: ",") + "}"
            }
            return line + "}\n"
        }
    }

    /// The syslog priority of a level (sd-daemon(3) prefixes): debug 7, info 6, notice 5, warning 4, error 3, critical 2.
    public static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }
}

/// Where fluxd's stderr goes.
public enum LogDestination {
    /// Whether stderr is systemd's journal: `JOURNAL_STREAM` (set by systemd for a service whose stderr is the
    /// journal) names stderr's device and inode (systemd.exec(5)).
    public static func isJournal(journalStream: String?) -> Bool {
        guard let value = journalStream else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(2, &st) == 0 else { return false }
        return UInt64(st.st_dev) == device && UInt64(st.st_ino) == inode
    }
}

// MARK: - Formatting

/// Newlines and other control characters of a text line escaped (one event, one line).
private func oneLine(_ text: String) -> String {
    guard text.utf8.contains(where: { $0 < 0x20 }) else { return text }
    var out = ""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        default:
            if scalar.value < 0x20 { out += "\\u{\(String(scalar.value, radix: 16))}" } else { out.unicodeScalars.append(scalar) }
        }
    }
    return out
}

/// A metadata value in a text line: bare when it has no spaces, quotes or control characters, else quoted.
private func textValue(_ value: Logger.Metadata.Value) -> String {
    let text = "\(value)"
    if !text.isEmpty && !text.utf8.contains(where: { $0 <= 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "=") }) {
        return text
    }
    return jsonString(text)
}

/// A metadata value in JSON: strings as strings, arrays and dictionaries as JSON.
private func jsonValue(_ value: Logger.Metadata.Value) -> String {
    switch value {
    case .string(let s): return jsonString(s)
    case .stringConvertible(let c): return jsonString(c.description)
    case .array(let a): return "[" + a.map(jsonValue).joined(separator: ",") + "]"
    case .dictionary(let d): return "{" + d.keys.sorted().map { jsonString($0) + ":" + jsonValue(d[$0]!) }.joined(separator: ",") + "}"
    }
}

/// `text` as a JSON string (FluxCore's escaping, the one every frame fluxd builds uses).
func jsonString(_ text: String) -> String {
    var bytes: [UInt8] = []
    appendEscaped(text, to: &bytes)
    return String(decoding: bytes, as: UTF8.self)
}

/// Milliseconds since the epoch as RFC 3339 UTC with milliseconds: `2026-11-24T00:21:07.123Z`.
func rfc3339(_ millis: Int64) -> String {
    var seconds = time_t(millis / 1000)
    var parts = tm()
    gmtime_r(&seconds, &parts)
    func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
    let ms = Int(millis % 1000)
    let msText = ms < 10 ? "00\(ms)" : ms < 100 ? "0\(ms)" : "\(ms)"
    return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)).\(msText)Z"
}

private func nowMillis() -> Int64 {
    var t = timespec()
    clock_gettime(CLOCK_REALTIME, &t)
    return Int64(t.tv_sec) * 1000 + Int64(t.tv_nsec) / 1_000_000
}

private func writeAllToStderr(_ bytes: [UInt8]) {
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == EINTR { continue }
            return
        }
        offset += n
    }
}

/// One log format for every FluxBus process (docs/logging.md): a process that uses the Swift SDKs calls
/// `FluxLogging.bootstrap()` once, first thing in `main`, and its lines (the SDKs', and its own through any
/// `Logger`) look like fluxd's: `TIME LEVEL LABEL: message key=value`, time in UTC with milliseconds. A library
/// never bootstraps logging itself: an application that already chose a `LogHandler` keeps it.
public enum FluxLogging {
    /// Bootstraps swift-log with `FluxLogHandler` to stderr at `level` (default: `FLUXBUS_LOG_LEVEL`, else
    /// info) in `format` (default: `FLUXBUS_LOG_FORMAT`, else text); under systemd's journal the text lines carry
    /// their priority instead of a time, as fluxd's do, and for a worker fluxd started (`FLUXBUS_LOG_TIME=0`, set
    /// by fluxd: it logs each line it reads with its own time) they start with the level. Call it once per process,
    /// before making any `Logger`.
    public static func bootstrap(level: Logger.Level? = nil, format: LogFormat? = nil) {
        let environment = { (name: String) in getenv(name).map { String(cString: $0) } }
        let settings = LogSettings(
            level: level ?? environment("FLUXBUS_LOG_LEVEL").flatMap(Logger.Level.init(rawValue:)) ?? .info,
            format: format ?? environment("FLUXBUS_LOG_FORMAT").flatMap(LogFormat.init(rawValue:)) ?? .text)
        let journald = LogDestination.isJournal(journalStream: environment("JOURNAL_STREAM"))
        let timestamps = environment("FLUXBUS_LOG_TIME") != "0"
        LoggingSystem.bootstrap { label in
            FluxLogHandler(label: label, settings: settings, journald: journald, timestamps: timestamps)
        }
    }
}
