import ArgumentParser
import FluxClient
import FluxCore
import Foundation

/// `fluxctl dispatch TYPE [PAYLOAD]`: dispatches one action; with `--wait`, prints its settlement.
struct Dispatch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Dispatch an action.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The action type, e.g. todo/create.") var type: String
    @Argument(help: "The payload as JSON, e.g. '{\"title\":\"milk\"}'.") var payload: String?
    @Flag(name: .long, help: "Wait for the settlement and print each store's result.") var wait = false

    func run() async throws {
        let payloadBytes = try payload.map { try parseJSONArgument($0, what: "the payload") }
        let client = try await options.connect()
        defer { Task { await client.close() } }
        guard wait else {
            // Fire and forget. A ping after the dispatch is a barrier: frames are ordered, so an error about the
            // dispatch (no-handler, ...) arrives before the pong.
            let frames = client.receivedFrames()
            let id = try client.dispatch(type: type, payloadJSON: payloadBytes)
            try client.sendRaw(body: Array(#"{"op":"ping","id":"fluxctl-barrier"}"#.utf8))
            let problem = try await withTimeout(options) { () -> FluxError? in
                for await body in frames {
                    guard let env = try? Envelope(body: body) else { continue }
                    let op = env.string("op").value
                    if op == "error", env.string("ref").value == id {
                        return .server(ServerError(rawCode: env.string("code").value ?? "?",
                                                   message: env.string("message").value ?? "", ref: id))
                    }
                    if op == "pong", env.string("id").value == "fluxctl-barrier" { return nil }
                }
                return .closed
            }
            if let problem { try report(problem) }
            if !options.json { emit("dispatched \(type)") }
            return
        }
        let settlement: Settlement
        do {
            settlement = try await withTimeout(options) { [type] in
                try await client.dispatchAndSettle(type: type, payloadJSON: payloadBytes)
            }
        } catch let error as FluxError {
            try report(error)
            return
        }
        var failed = false
        for r in settlement.results {
            switch r.status {
            case .done(let version):
                emit(options.json ? #"{"store":"\#(r.store)","status":"done","version":\#(version),"seq":\#(settlement.seq)}"#
                     : "\(r.store): done, version \(version) (seq \(settlement.seq))")
            case .rejected(let code, let message):
                failed = true
                emit(options.json ? #"{"store":"\#(r.store)","status":"rejected","code":"\#(code)","seq":\#(settlement.seq)}"#
                     : "\(r.store): rejected \(code): \(message) (seq \(settlement.seq))")
            case .unavailable(let code, let message):
                failed = true
                emit(options.json ? #"{"store":"\#(r.store)","status":"unavailable","code":"\#(code)","seq":\#(settlement.seq)}"#
                     : "\(r.store): unavailable \(code): \(message) (seq \(settlement.seq))")
            }
        }
        if failed { throw ExitCode(1) }
    }

    private func report(_ error: FluxError) throws {
        printError("fluxctl: \(error)")
        throw ExitCode(error.code == .noHandler ? 1 : 5)
    }
}

/// `fluxctl state STORE`: prints a store's retained snapshot.
struct State: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print a store's current state.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The store's name.") var store: String

    func run() async throws {
        let client = try await options.connect()
        defer { Task { await client.close() } }
        do {
            let snapshot = try await withTimeout(options) { [store] in try await client.get(store: store, as: AnyJSON.self) }
            if options.json {
                emit(#"{"store":"\#(snapshot.store)","version":\#(snapshot.version),"seq":\#(snapshot.seq),"state":\#(snapshot.state.text(pretty: false))}"#)
            } else {
                emit("\(snapshot.store) version \(snapshot.version) (seq \(snapshot.seq))")
                emit(snapshot.state.text(pretty: true))
            }
        } catch let error as FluxError {
            printError("fluxctl: \(error)")
            throw ExitCode(5)
        }
    }
}

/// `fluxctl watch STORE`: follows a store's snapshots live.
struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Follow a store's snapshots.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The store's name.") var store: String
    @Option(name: .long, help: "Exit after this many snapshots.") var count: Int?

    func run() async throws {
        let client = try await options.connect()
        defer { Task { await client.close() } }
        var seen = 0
        for try await event in client.subscribe(store: store, as: AnyJSON.self) {
            switch event {
            case .subscribed(let status):
                if !options.json { emit("watching \(store) (\(status.rawValue))") }
            case .snapshot(let s):
                emit(options.json
                     ? #"{"store":"\#(s.store)","version":\#(s.version),"seq":\#(s.seq),"state":\#(s.state.text(pretty: false))}"#
                     : "version \(s.version) (seq \(s.seq)): \(s.state.text(pretty: false))")
                seen += 1
                if let count, seen >= count { return }
            case .storeDown(let reason):
                emit(options.json ? #"{"store":"\#(store)","event":"store-down","reason":"\#(reason)"}"# : "store down (\(reason))")
            case .storeUp(let version):
                emit(options.json ? #"{"store":"\#(store)","event":"store-up","version":\#(version)}"# : "store up (version \(version))")
            }
        }
    }
}

/// `fluxctl stores`: a table of the stores fluxd knows.
struct Stores: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List stores: patterns, waitFor, version, subscribers, queue, owner.")
    @OptionGroup var options: GlobalOptions

    func run() async throws {
        let client = try await options.connect()
        defer { Task { await client.close() } }
        let info = try await withTimeout(options) { try await client.info() }
        if options.json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            for store in info.stores { emit(String(decoding: try encoder.encode(store), as: UTF8.self)) }
            return
        }
        var rows = [["STORE", "STATUS", "HANDLES", "WAITFOR", "VERSION", "SUBS", "QUEUED", "OWNER"]]
        for s in info.stores {
            let owner = s.owner.map { o in "\(o.name ?? "?") pid \(o.pid.map(String.init) ?? "?") uid \(o.uid.map(String.init) ?? "?")" } ?? "-"
            rows.append([s.name, s.status ?? "?", (s.handles ?? []).joined(separator: ","), (s.waitFor ?? []).joined(separator: ","),
                         "\(s.version ?? 0)", "\(s.subscribers ?? 0)", "\((s.queued ?? 0) + (s.inflight ?? 0))", owner])
        }
        let widths = rows[0].indices.map { i in rows.map { $0[i].count }.max() ?? 0 }
        for row in rows {
            emit(row.enumerated().map { i, cell in cell.padding(toLength: widths[i], withPad: " ", startingAt: 0) }
                .joined(separator: "  ").trimmingCharacters(in: .whitespaces))
        }
    }
}

/// `fluxctl ping`: round-trip time to fluxd.
struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Measure the round trip to fluxd.")
    @OptionGroup var options: GlobalOptions
    @Option(name: .long, help: "How many pings.") var count = 1

    func run() async throws {
        let client = try await options.connect()
        defer { Task { await client.close() } }
        var times: [Double] = []
        for _ in 0..<max(1, count) {
            let d = try await withTimeout(options) { try await client.ping() }
            let us = Double(d.components.attoseconds) / 1e12 + Double(d.components.seconds) * 1e6
            times.append(us)
            if !options.json && count == 1 { emit(String(format: "pong from %@ in %.0f µs", options.socketPath, us)) }
        }
        times.sort()
        let median = times[times.count / 2]
        let p99 = times[min(times.count - 1, Int(Double(times.count) * 0.99))]
        if options.json {
            emit(String(format: #"{"count":%d,"minUs":%.1f,"medianUs":%.1f,"p99Us":%.1f}"#, times.count, times[0], median, p99))
        } else if count > 1 {
            emit(String(format: "%d pings: min %.0f µs, median %.0f µs, p99 %.0f µs", times.count, times[0], median, p99))
        }
    }
}
