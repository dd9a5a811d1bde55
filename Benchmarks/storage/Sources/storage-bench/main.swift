// Appends N journal-like records (an action of ~300 bytes: seq, store, type, payload) in batches, durably, two
// ways, and prints records/s and the latency of one batch's commit:
//   log:    one file, write(2) of the batch's framed records (length + CRC32C-sized checksum + body), then one
//           fdatasync (group commit: what fluxd's `always` mode does once per loop iteration);
//   sqlite: GRDB DatabaseQueue in WAL mode, one transaction per batch, synchronous=FULL (durable per commit) and
//           NORMAL (durable at checkpoints: what `batch` would be).
// Also the disk's own fdatasync latency (a 1-byte write + fdatasync), the floor of every durable commit.
import Foundation
import GRDB
#if canImport(Glibc)
import Glibc
#endif

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

func percentile(_ xs: [Double], _ p: Double) -> Double {
    let s = xs.sorted()
    return s.isEmpty ? 0 : s[min(s.count - 1, Int(Double(s.count) * p))]
}

let arguments = CommandLine.arguments
func option(_ name: String, _ fallback: String) -> String {
    if let i = arguments.firstIndex(of: name), i + 1 < arguments.count { return arguments[i + 1] }
    return fallback
}
let directory = option("--dir", NSTemporaryDirectory() + "storage-bench-\(getpid())")
let records = Int(option("--records", "20000"))!
try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(atPath: directory) }

let payload = String(repeating: "x", count: 220)
func record(_ seq: Int) -> [UInt8] {
    Array(#"{"seq":\#(seq),"store":"todos","type":"todo/create","origin":7,"payload":{"title":"\#(payload)"}}"#.utf8)
}

func report(_ label: String, batch: Int, seconds: Double, commits: [Double]) {
    let rate = Double(records) / seconds
    print(String(format: "%-24@ batch %4d  %9.0f records/s  commit p50 %7.1f µs  p99 %8.1f µs", label as NSString, batch,
                 rate, percentile(commits, 0.5) * 1e6, percentile(commits, 0.99) * 1e6))
}

// The disk's floor.
do {
    let path = directory + "/sync-probe"
    let fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0o600)
    var lat: [Double] = []
    var byte: UInt8 = 1
    for _ in 0..<500 {
        let t = now()
        _ = write(fd, &byte, 1)
        fdatasync(fd)
        lat.append(now() - t)
    }
    close(fd)
    print(String(format: "fdatasync of 1 byte on %@: p50 %.1f µs, p99 %.1f µs", directory as NSString,
                 percentile(lat, 0.5) * 1e6, percentile(lat, 0.99) * 1e6))
}

// The append-only log with group commit.
func logRun(batch: Int, sync: Bool) {
    let path = directory + "/log-\(batch)-\(sync)"
    let fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_APPEND, 0o600)
    var commits: [Double] = []
    var buffer: [UInt8] = []
    buffer.reserveCapacity(batch * 400)
    let start = now()
    var seq = 1
    while seq <= records {
        buffer.removeAll(keepingCapacity: true)
        for _ in 0..<batch where seq <= records {
            let body = record(seq)
            var length = UInt32(body.count).bigEndian
            withUnsafeBytes(of: &length) { buffer.append(contentsOf: $0) }
            var sum: UInt32 = 2166136261  // FNV-1a stands in for the checksum's cost
            for b in body { sum = (sum ^ UInt32(b)) &* 16777619 }
            withUnsafeBytes(of: &sum) { buffer.append(contentsOf: $0) }
            buffer.append(contentsOf: body)
            seq += 1
        }
        let t = now()
        buffer.withUnsafeBytes { _ = write(fd, $0.baseAddress, $0.count) }
        if sync { fdatasync(fd) }
        commits.append(now() - t)
    }
    let elapsed = now() - start
    close(fd)
    report(sync ? "log + fdatasync" : "log, no sync", batch: batch, seconds: elapsed, commits: commits)
}

func sqliteRun(batch: Int, synchronous: String) throws {
    let path = directory + "/db-\(batch)-\(synchronous).sqlite"
    var config = Configuration()
    config.prepareDatabase { db in
        try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
    }
    let queue = try DatabaseQueue(path: path, configuration: config)
    try queue.writeWithoutTransaction { db in
        try db.execute(sql: "PRAGMA journal_mode = WAL")
        try db.execute(sql: "CREATE TABLE actions (seq INTEGER PRIMARY KEY, body BLOB NOT NULL)")
    }
    var commits: [Double] = []
    let start = now()
    var seq = 1
    while seq <= records {
        let first = seq
        let t = now()
        try queue.inTransaction { db in
            let statement = try db.cachedStatement(sql: "INSERT INTO actions (seq, body) VALUES (?, ?)")
            var s = first
            for _ in 0..<batch where s <= records {
                try statement.execute(arguments: [s, Data(record(s))])
                s += 1
            }
            return .commit
        }
        seq = min(records + 1, first + batch)
        commits.append(now() - t)
    }
    let elapsed = now() - start
    report("sqlite WAL sync=\(synchronous)", batch: batch, seconds: elapsed, commits: commits)
}

print("records: \(records) of \(record(1).count) bytes")
for batch in [1, 64] {
    logRun(batch: batch, sync: false)
    logRun(batch: batch, sync: true)
    try sqliteRun(batch: batch, synchronous: "FULL")
    try sqliteRun(batch: batch, synchronous: "NORMAL")
}
