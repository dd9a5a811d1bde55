import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation

/// Runs a host operation (`workers`, `restart-worker`, `stop-worker`) through the SDK, turning fluxd's refusals into
/// clear messages: `unknown-op` means fluxd was started without `--config`.
private func hostRequest<T: Sendable>(_ options: GlobalOptions, _ body: (FluxClient) async throws(FluxError) -> T) async throws -> T {
    let client = try await options.connect()
    defer { client.abort() }
    do {
        return try await body(client)
    } catch {
        switch error {
        case .server(let e) where e.code == .unknownOp:
            throw fail(Exit.refused, "fluxd at \(options.socketPath) supervises no workers (start it with fluxd --config FILE)")
        case .server(let e) where e.code == .unknownWorker:
            throw fail(Exit.refused, e.message)
        default:
            throw failure(error, socket: options.socketPath)
        }
    }
}

/// A worker as fluxd sent it, every field in fluxd's order, with the wire's snake_case field names in camelCase like
/// the rest of fluxctl's `--json` output (`uptime_ms` -> `uptimeMs`, `last_exit` -> `lastExit`; SPEC §8.11 keeps
/// the wire's names).
private func workerJSON(_ w: Worker) -> JSONValue {
    guard case .object(let members)? = try? JSONValue(parsing: w.json) else { return .null }
    return .object(members.map { (key: camelCase($0.key), value: $0.value) })
}

/// `uptime_ms` -> `uptimeMs`: each letter after an underscore capitalised, the underscores dropped (a name without
/// one is returned as it is).
private func camelCase(_ name: String) -> String {
    guard name.contains("_") else { return name }
    let parts = name.split(separator: "_", omittingEmptySubsequences: true)
    guard let first = parts.first else { return name }
    return String(first) + parts.dropFirst().map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
}

private func workerRow(_ w: JSONValue) -> [String] {
    let state = w["state"]?.stringValue ?? "?"
    let styled: String
    switch state {
    case "running": styled = Style.green(state)
    case "failed": styled = Style.red(state)
    case "starting", "backing-off", "stopping": styled = Style.yellow(state)
    default: styled = state
    }
    var exit = "-"
    if let code = w["lastExit"]?["code"]?.intValue { exit = "exit \(code)" }
    if let signal = w["lastExit"]?["signal"]?.stringValue { exit = signal }
    var uptime = "-"
    if let ms = w["uptimeMs"]?.intValue { uptime = formatUptime(ms) }
    let stores: String
    if case .array(let items)? = w["stores"], !items.isEmpty {
        stores = items.compactMap(\.stringValue).joined(separator: ",")
    } else {
        stores = "-"
    }
    return [Style.bold(w["name"]?.stringValue ?? "?"), styled, w["pid"]?.intValue.map(String.init) ?? "-",
            w["restarts"]?.intValue.map(String.init) ?? "0", uptime, exit, stores, w["error"]?.stringValue ?? ""]
}

private func formatUptime(_ ms: Int) -> String {
    let s = ms / 1000
    if s < 60 { return "\(s)s" }
    if s < 3600 { return "\(s / 60)m\(s % 60)s" }
    return "\(s / 3600)h\((s % 3600) / 60)m"
}

private func printWorker(_ typed: Worker, json: Bool) {
    let worker = workerJSON(typed)
    if json { emit(worker.compact) } else { for line in table(["WORKER", "STATE", "PID", "RESTARTS", "UPTIME", "LAST EXIT", "STORES", "PROBLEM"], [workerRow(worker)]) { emit(line) } }
}

/// `fluxctl workers`: the workers fluxd supervises (fluxd --config).
struct Workers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the workers fluxd supervises: state, pid, restarts, uptime, last exit.",
        discussion: "States: starting, running, backing-off, stopping, stopped, failed. Needs fluxd --config FILE.")
    @OptionGroup var options: GlobalOptions

    func run() async throws {
        let requestTimeout = options.requestDuration
        let workers = try await hostRequest(options) { (client) throws(FluxError) in
            try await client.workers(timeout: requestTimeout)
        }.map(workerJSON)
        if options.json {
            for worker in workers { emit(worker.compact) }
            return
        }
        if workers.isEmpty {
            emit("no workers")
            return
        }
        for line in table(["WORKER", "STATE", "PID", "RESTARTS", "UPTIME", "LAST EXIT", "STORES", "PROBLEM"], workers.map(workerRow)) {
            emit(line)
        }
    }
}

/// `fluxctl restart NAME`: restarts a supervised worker (also a failed or stopped one).
struct Restart: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Restart a worker fluxd supervises (SIGTERM, then start again; a failed worker gets a new chance).")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The worker's name (as in the config file).") var name: String

    func run() async throws {
        let name = self.name, requestTimeout = options.requestDuration
        let worker = try await hostRequest(options) { (client) throws(FluxError) in
            try await client.restartWorker(name, timeout: requestTimeout)
        }
        printWorker(worker, json: options.json)
    }
}

/// `fluxctl stop NAME`: stops a supervised worker until it is restarted.
struct Stop: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop a worker fluxd supervises (SIGTERM, SIGKILL after its stop timeout); it stays stopped until restarted.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The worker's name (as in the config file).") var name: String

    func run() async throws {
        let name = self.name, requestTimeout = options.requestDuration
        let worker = try await hostRequest(options) { (client) throws(FluxError) in
            try await client.stopWorker(name, timeout: requestTimeout)
        }
        printWorker(worker, json: options.json)
    }
}
