import FluxCore
import Foundation

/// The `[fluxd]` keys of the config file that are fluxd's command-line options (docs/configuration.md): each key
/// is its option's name in snake_case (`queue_limit` is `--queue-limit`). The defaults, the checks and the help
/// are the options' own (Sources/fluxd); a value in the file is given to fluxd as if it came before the command
/// line's arguments, so the command line overrides the file.
public enum DaemonSettings {
    /// How a key's value is written in TOML.
    public enum ValueType: Sendable { case string, path, integer, bool }

    /// A key: its type, and whether a reload applies it to the running fluxd (`live`) or it takes a restart.
    public struct Key: Sendable {
        public var type: ValueType
        public var live: Bool
    }

    /// Every such key. Live: the log level and format. Everything else takes a restart: the socket and data
    /// directory are fluxd's identity; the limits are announced to every peer in `welcome.limits` (a peer sized
    /// its behaviour by what it was told), the journal's settings shape files already written, and the metrics
    /// endpoint listens once. With socket activation a restart is a pause of tens of milliseconds (docs/systemd.md).
    public static let keys: [String: Key] = {
        var keys: [String: Key] = [:]
        for key in ["socket", "data_dir"] { keys[key] = Key(type: .path, live: false) }
        for key in ["socket_mode", "durability", "metrics"] { keys[key] = Key(type: .string, live: false) }
        for key in ["log_level", "log_format"] { keys[key] = Key(type: .string, live: true) }
        for key in ["ephemeral", "replay", "close_stalled_stores"] { keys[key] = Key(type: .bool, live: false) }
        for key in ["max_frame", "queue_limit", "queue_timeout", "sync_interval", "segment_bytes", "checkpoint_bytes", "retain_actions",
                    "retain_hours", "retain_bytes", "disk_per_user", "store_window", "handshake_timeout", "max_backlog", "delta_history", "fair_pending",
                    "max_queries", "max_query_bytes", "max_subscriptions", "max_wait_for", "max_connections",
                    "max_connections_per_user", "max_handshakes", "max_handshakes_per_user", "max_stores_per_connection",
                    "memory_budget", "memory_per_user", "max_outcomes", "connection_allowance", "ping_interval", "max_pings_out",
                    "store_timeout", "turn_micros"] {
            keys[key] = Key(type: .integer, live: false)
        }
        return keys
    }()

    /// The command-line option of a key (`queue_limit` -> `--queue-limit`).
    public static func option(_ key: String) -> String { "--" + key.replacingOccurrences(of: "_", with: "-") }

    /// The key of a command-line argument (`--queue-limit` or `--queue-limit=5` -> `queue_limit`), if it is one.
    public static func key(ofArgument argument: String) -> String? {
        guard argument.hasPrefix("--") else { return nil }
        let name = argument.dropFirst(2).split(separator: "=", maxSplits: 1).first.map(String.init) ?? ""
        let key = name.replacingOccurrences(of: "-", with: "_")
        return keys[key] != nil ? key : nil
    }

    /// `settings` as command-line arguments, in key order (a `false` boolean gives none).
    public static func arguments(_ settings: [String: String]) -> [String] {
        var arguments: [String] = []
        for key in settings.keys.sorted() {
            let value = settings[key]!
            if keys[key]?.type == .bool {
                if value == "true" { arguments.append(option(key)) }
            } else {
                arguments += [option(key), value]
            }
        }
        return arguments
    }

    /// What a reload from `running` to `fresh` would change, split: keys a reload applies, and keys that take a
    /// restart (those the command line sets are left out: the command line wins over the file either way).
    public static func changes(from running: [String: String], to fresh: [String: String],
                               commandLine: Set<String>) -> (live: [String], restart: [String]) {
        var live: [String] = [], restart: [String] = []
        for key in Set(running.keys).union(fresh.keys).sorted() where running[key] != fresh[key] && !commandLine.contains(key) {
            if keys[key]?.live == true { live.append(key) } else { restart.append(key) }
        }
        return (live, restart)
    }
}
