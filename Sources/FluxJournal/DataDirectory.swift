#if canImport(Glibc)
import Glibc
#endif

/// Where a durable fluxd keeps its journal when no `--data-dir` is given: `$XDG_STATE_HOME/fluxbus/<bus>`, else
/// `~/.local/state/fluxbus/<bus>`, where `<bus>` is derived from the socket path, so two buses on different
/// sockets never share a journal (SPEC §15, docs/journal.md).
public func defaultDataDirectory(socketPath: String, environment: [String: String]? = nil) -> String? {
    func env(_ key: String) -> String? {
        if let environment { return environment[key] }
        guard let v = getenv(key) else { return nil }
        return String(cString: v)
    }
    let base: String
    if let state = env("XDG_STATE_HOME"), state.hasPrefix("/") {
        base = state
    } else if let home = env("HOME"), home.hasPrefix("/") {
        base = home + "/.local/state"
    } else {
        return nil
    }
    return base + "/fluxbus/" + busName(socketPath: socketPath)
}

/// A directory name for the bus on `socketPath`: the path's readable characters (`/` as `-`, at most 48 of the
/// last ones) and a hash of the whole path (FNV-1a, 64 bits), e.g. `run-user-1000-fluxbus-fluxd.sock-3f2a…`.
public func busName(socketPath: String) -> String {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for b in socketPath.utf8 {
        hash ^= UInt64(b)
        hash &*= 0x100_0000_01b3
    }
    var readable = ""
    for c in socketPath.unicodeScalars {
        if c == "/" { if !readable.isEmpty && !readable.hasSuffix("-") { readable += "-" } }
        else if c.isASCII && (c.properties.isAlphabetic || ("0"..."9").contains(c) || c == "." || c == "_" || c == "-") {
            readable.unicodeScalars.append(c)
        }
    }
    let hex = String(hash, radix: 16)
    return String(readable.suffix(48)) + "-" + String(repeating: "0", count: 16 - hex.count) + hex
}
