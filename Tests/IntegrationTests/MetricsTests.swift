import FluxClient
import Foundation
import Glibc
import Testing

private struct Create: Encodable { var title: String }
private struct Toggle: Encodable { var id: Int }

/// A TCP connection to 127.0.0.1:`port` (the caller closes it).
func connectLoopback(port: UInt16) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw HarnessError.system("socket", errno) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard rc == 0 else {
        let error = errno
        close(fd)
        throw HarnessError.system("connect 127.0.0.1:\(port)", error)
    }
    return fd
}

/// An HTTP/1.1 exchange with fluxd's metrics endpoint over a plain TCP socket: `request` is sent as is, and the
/// whole response (fluxd closes after it) is returned, or nil when nothing came within `timeout`.
func httpExchange(port: UInt16, request: String, timeout: Duration = .seconds(10)) throws -> String? {
    let fd = try connectLoopback(port: port)
    defer { close(fd) }
    let bytes = Array(request.utf8)
    guard bytes.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else {
        throw HarnessError.system("send", errno)
    }
    var response: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    let deadline = ContinuousClock.now + timeout
    while true {
        switch try readWithDeadline(fd: fd, into: &buffer, deadline: deadline) {
        case .bytes(let n): response += buffer[..<n]
        case .eof: return String(decoding: response, as: UTF8.self)
        case .timeout: return nil
        }
    }
}

/// The samples of a Prometheus text exposition: `name{labels}` -> value (comments skipped).
func parseExposition(_ text: String) -> [String: Double] {
    var samples: [String: Double] = [:]
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
        samples[String(line[..<space])] = value
    }
    return samples
}

@Suite("fluxd --metrics: Prometheus text exposition over HTTP on loopback")
struct MetricsTests {
    @Test("a scrape counts the actions dispatched, done and rejected per store, their latency, connections by role; other paths and methods get 404/405")
    func scrape() async throws {
        try await withBus(["--metrics", "127.0.0.1:0"]) { bus in
            let port = try await metricsPort(of: bus)

            _ = try await bus.start("todo-store")
            let client = try await bus.connect("metrics-client")
            let n = 7
            for i in 1...n {
                _ = try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "t\(i)"))
            }
            let rejected = try await client.dispatchAndSettle(type: "todo/toggle", payload: Toggle(id: 999))
            #expect(!rejected.allDone)

            // A scrape has fluxd's loop copy its numbers in first: the last action shows at once (the loop
            // deadline only guards against a fluxd that never refreshes). Everything is checked in one scrape.
            let samples = try await offPool { () -> [String: Double] in
                let deadline = ContinuousClock.now + .seconds(10)
                while true {
                    let response = try #require(try httpExchange(port: port, request: "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"))
                    #expect(response.hasPrefix("HTTP/1.1 200 OK\r\n"))
                    #expect(response.contains("Content-Type: text/plain; version=0.0.4"))
                    let body = String(response.split(separator: "\r\n\r\n", maxSplits: 1).last ?? "")
                    let samples = parseExposition(body)
                    if samples["fluxbus_action_latency_seconds_count{store=\"todos\"}"] == Double(n + 1) || ContinuousClock.now > deadline {
                        return samples
                    }
                    usleep(100_000)  // polling interval, not synchronisation: the gauge decides
                }
            }
            #expect(samples["fluxbus_actions_dispatched_total{store=\"todos\"}"] == Double(n + 1))
            #expect(samples["fluxbus_actions_done_total{store=\"todos\"}"] == Double(n))
            #expect(samples["fluxbus_actions_rejected_total{store=\"todos\",code=\"todo/not-found\"}"] == 1)
            #expect(samples["fluxbus_action_latency_seconds_count{store=\"todos\"}"] == Double(n + 1))
            #expect((samples["fluxbus_action_latency_seconds_sum{store=\"todos\"}"] ?? 0) > 0)
            #expect(samples["fluxbus_action_latency_seconds_bucket{store=\"todos\",le=\"+Inf\"}"] == Double(n + 1))
            #expect(samples["fluxbus_connections{role=\"client\"}"] == 1)
            #expect(samples["fluxbus_connections{role=\"store\"}"] == 1)
            #expect(samples["fluxbus_store_up{store=\"todos\"}"] == 1)
            #expect(samples["fluxbus_build_info{version=\"0.4.0\"}"] == 1)
            #expect(samples.keys.allSatisfy { !$0.contains("peer") && !$0.contains("connection=") }, "no per-connection labels")

            let (notFound, post, garbage) = try await offPool {
                (try httpExchange(port: port, request: "GET /other HTTP/1.1\r\n\r\n"),
                 try httpExchange(port: port, request: "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
                 try httpExchange(port: port, request: "\u{0}\u{1}garbage\r\n\r\n"))
            }
            #expect(notFound?.hasPrefix("HTTP/1.1 404 ") == true)
            #expect(post?.hasPrefix("HTTP/1.1 405 ") == true)
            #expect(garbage?.hasPrefix("HTTP/1.1 400 ") == true)
            // fluxd itself was not disturbed.
            #expect(try await client.dispatchAndSettle(type: "todo/create", payload: Create(title: "after")).allDone)
        }
    }

    @Test("every family is there from the start (each error code at 0, a store's failures at 0, the memory budget, process_*, the journal), and the scrape's families are docs/metrics.md's table")
    func familiesFromTheStart() async throws {
        let data = try TempDirectory(prefix: "fluxdata")
        defer { data.remove() }
        try await withBus(["--metrics", "127.0.0.1:0", "--data-dir", data.path]) { bus in
            let port = try await metricsPort(of: bus)
            _ = try await bus.start("todo-store")
            let body = try await offPool { () -> String in
                let response = try #require(try httpExchange(port: port, request: "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"))
                return String(response.split(separator: "\r\n\r\n", maxSplits: 1).last ?? "")
            }
            let samples = parseExposition(body)
            for code in ["bad-frame", "forbidden", "memory-budget", "slow-consumer", "disk-quota", "outcome-quota"] {
                #expect(samples["fluxbus_errors_total{code=\"\(code)\"}"] == 0, "\(code)")
            }
            #expect(samples["fluxbus_actions_failed_total{store=\"todos\",code=\"store-unavailable\"}"] == 0)
            #expect(body.contains("# TYPE fluxbus_actions_rejected_total counter\n"))
            #expect(body.contains("# TYPE fluxbus_action_latency_seconds histogram\n"))
            #expect((samples["fluxbus_memory_used_bytes"] ?? 0) > 0)
            #expect(samples["fluxbus_memory_limit_bytes"] == 1_073_741_824)
            #expect(samples["fluxbus_memory_per_user_bytes"] == 268_435_456)
            #expect(samples["fluxbus_memory_refusals_total"] == 0)
            #expect((samples["process_resident_memory_bytes"] ?? 0) > 1_000_000)
            #expect((samples["process_open_fds"] ?? 0) > 3)
            #expect((samples["process_max_fds"] ?? 0) >= (samples["process_open_fds"] ?? 0))
            #expect((samples["process_start_time_seconds"] ?? 0) > 1_700_000_000)
            #expect(samples["process_cpu_seconds_total"] != nil)
            #expect(samples["fluxbus_journal_syncs_total"] != nil)

            // docs/metrics.md's table names exactly the families of a scrape (the workers' restarts need workers
            // under --config, so they are the one family this scrape cannot show).
            var scraped = Set<String>()
            for line in body.split(separator: "\n") where line.hasPrefix("# TYPE ") {
                scraped.insert(String(line.split(separator: " ")[2]))
            }
            let docs = try String(contentsOfFile: metricsPackageRoot + "/docs/metrics.md", encoding: .utf8)
            let table = docs[docs.range(of: "## The metrics")!.lowerBound...]
            var documented = Set<String>()
            for row in table.split(separator: "\n") where row.hasPrefix("| `") {
                let first = row.split(separator: "|")[0]
                for part in first.split(separator: "`") where part.hasPrefix("fluxbus_") || part.hasPrefix("process_") {
                    documented.insert(String(part))
                }
            }
            #expect(scraped.subtracting(documented).isEmpty, "scraped, not in docs/metrics.md: \(scraped.subtracting(documented).sorted())")
            #expect(documented.subtracting(scraped) == ["fluxbus_worker_restarts_total"], "in docs/metrics.md, not scraped: \(documented.subtracting(scraped).sorted())")
        }
    }

    @Test("80 slow clients that never finish their request head (slowloris) do not keep a real scrape from being answered; fluxd ends theirs", .onDedicatedThreads)
    func slowClients() throws {
        let fluxd = try Fluxd(arguments: ["--metrics", "127.0.0.1:0"])
        defer { fluxd.cleanup() }
        _ = try fluxd.waitForReady()
        let deadline = ContinuousClock.now + .seconds(20)
        while !fluxd.stderr.contains("metrics on http://127.0.0.1:") && ContinuousClock.now < deadline {
            usleep(20_000)  // polling interval, not synchronisation: the log line decides
        }
        let portText = try #require(fluxd.stderr.split(separator: "metrics on http://127.0.0.1:").last?.prefix { $0.isNumber })
        let port = try #require(UInt16(portText))
        // More slow clients than the endpoint serves at once (MetricsServer.maxConnections, 64), each with half a head.
        var slow: [Int32] = []
        defer { for fd in slow { close(fd) } }
        for _ in 0..<80 {
            let fd = try connectLoopback(port: port)
            slow.append(fd)
            let part = Array("GET /metrics HTTP/1.1\r\nHost: x\r\n".utf8)
            _ = part.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }
        // A real scrape is answered while they hang (one at a time, it would wait 64 x 2 s behind them).
        let response = try httpExchange(port: port, request: "GET /metrics HTTP/1.1\r\n\r\n", timeout: .seconds(10))
        #expect(response?.hasPrefix("HTTP/1.1 200 ") == true, "\(response ?? "no answer within 10 s")")
        // Every slow client's connection is ended by fluxd (408 after the 2 s head timeout, or closed to make room).
        var buffer = [UInt8](repeating: 0, count: 4096)
        for fd in slow {
            var ended = false
            let until = ContinuousClock.now + .seconds(20)
            while !ended {
                do {
                    switch try readWithDeadline(fd: fd, into: &buffer, deadline: until) {
                    case .bytes: continue  // (a 408, then the end)
                    case .eof: ended = true
                    case .timeout: Issue.record("a slow client's connection was still open after 20 s"); ended = true
                    }
                } catch {
                    ended = true  // reset: closed with its half head unread, to make room
                }
            }
        }
    }

    @Test("--metrics refuses an address that is not loopback, before anything starts", .onDedicatedThreads)
    func refusesNonLoopback() throws {
        let fluxd = try Fluxd(arguments: ["--metrics", "0.0.0.0:9464"])
        defer { fluxd.cleanup() }
        #expect(fluxd.waitForExit(timeout: .seconds(20)) != 0)
        #expect(fluxd.stderr.contains("not a loopback address"), "\(fluxd.stderr)")
    }
}

/// The package's root directory (this file is Tests/IntegrationTests/MetricsTests.swift).
private let metricsPackageRoot: String = {
    var url = URL(fileURLWithPath: #filePath)
    for _ in 0..<3 { url.deleteLastPathComponent() }
    return url.path
}()

/// The port of the metrics endpoint a bus's fluxd listens on (`--metrics 127.0.0.1:0`: fluxd logs the port it got).
func metricsPort(of bus: Bus) async throws -> UInt16 {
    let log = try await offPool { () -> String in
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            let log = bus.fluxd.stderr
            if log.contains("metrics on http://127.0.0.1:") { return log }
            usleep(20_000)  // polling interval, not synchronisation: the log line decides
        }
        throw HarnessError.timedOut("the metrics log line")
    }
    let portText = try #require(log.split(separator: "metrics on http://127.0.0.1:").last?.prefix { $0.isNumber })
    return try #require(UInt16(portText))
}
