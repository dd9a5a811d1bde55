import Glibc

/// The standard `process_*` metrics of a Prometheus client (CPU seconds, resident and virtual memory, open and
/// maximum file descriptors, start time), read from /proc on the scrape's thread (docs/metrics.md).
struct ProcessStats: Sendable, Equatable {
    var cpuSeconds: Double = 0
    var residentBytes: Int = 0
    var virtualBytes: Int = 0
    var openFDs: Int = 0
    var maxFDs: Int = 0
    /// Seconds since the Unix epoch.
    var startTime: Double = 0

    /// This process's figures now (zeros for what cannot be read).
    static func read() -> ProcessStats {
        var stats = ProcessStats()
        let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        if let stat = readText("/proc/self/stat"), let parsed = parse(stat: stat), ticks > 0 {
            stats.cpuSeconds = Double(parsed.utime + parsed.stime) / ticks
            stats.virtualBytes = parsed.vsize
            stats.residentBytes = parsed.rss * page
            if let boot = bootTime() { stats.startTime = boot + Double(parsed.starttime) / ticks }
        }
        stats.openFDs = countEntries("/proc/self/fd")
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 {
            stats.maxFDs = limit.rlim_cur > UInt(Int.max) ? Int.max : Int(limit.rlim_cur)  // (RLIM_INFINITY: the most)
        }
        return stats
    }

    /// The fields of /proc/PID/stat this needs (proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24),
    /// counted after the command name's closing parenthesis (the name may hold spaces and parentheses).
    static func parse(stat: String) -> (utime: Int, stime: Int, starttime: Int, vsize: Int, rss: Int)? {
        guard let close = stat.lastIndex(of: ")") else { return nil }
        // Fields from the 3rd (state) on.
        let fields = stat[stat.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        func field(_ n: Int) -> Int? { n - 3 < fields.count ? Int(fields[n - 3]) : nil }
        guard let utime = field(14), let stime = field(15), let start = field(22), let vsize = field(23),
              let rss = field(24) else { return nil }
        return (utime, stime, start, vsize, rss)
    }

    /// `btime` of /proc/stat: the boot time in seconds since the epoch.
    private static func bootTime() -> Double? {
        guard let text = readText("/proc/stat") else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(String(line.dropFirst(6).filter { !$0.isWhitespace }))
        }
        return nil
    }

    private static func readText(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            bytes += buffer[0..<n]
            if bytes.count > 1 << 20 { break }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func countEntries(_ path: String) -> Int {
        guard let dir = opendir(path) else { return 0 }
        defer { closedir(dir) }
        var n = 0
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { n += 1 }
        }
        return max(0, n - 1)  // (the directory stream's own descriptor)
    }
}
