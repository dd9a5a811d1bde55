import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue
import Foundation

/// Sends a host-operation request (`workers`, `restart-worker`, `stop-worker`) and returns the reply, turning
/// fluxd's refusals into clear messages: `unknown-op` means fluxd was started without `--config`.
private func hostRequest(_ options: GlobalOptions, _ body: String, id: String, _ what: String) async throws -> JSONValue {
    let client = try await options.connect()
    defer { client.abort() }
    let reader = FrameReader(client)
    do {
        return try await request(client, reader, body, id: id, timeout: options.requestTimeout, what).value
    } catch let error as FluxError {
        if case .server(let e) = error {
            switch e.rawCode {
            case "unknown-op":
                throw fail(Exit.refused, "fluxd at \(options.socketPath) supervises no workers (start it with fluxd --config FILE)")
            case "unknown-worker":
                throw fail(Exit.refused, e.message)
            default:
                break
            }
        }
        throw failure(error, socket: options.socketPath)
    }
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
    if let code = w["last_exit"]?["code"]?.intValue { exit = "exit \(code)" }
    if let signal = w["last_exit"]?["signal"]?.stringValue { exit = signal }
    var uptime = "-"
    if let ms = w["uptime_ms"]?.intValue { uptime = formatUptime(ms) }
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

private func printWorker(_ worker: JSONValue?, json: Bool) {
    guard let worker else { return }
    if json { emit(worker.compact) } else { for line in table(["WORKER", "STATE", "PID", "RESTARTS", "UPTIME", "LAST EXIT", "STORES", "PROBLEM"], [workerRow(worker)]) { emit(line) } }
}

/// Sends the host request `op` (restart-worker, stop-worker) for the worker `name` and prints the worker fluxd
/// answers with.
private func workerRequest(_ options: GlobalOptions, op: String, id: String, name: String, _ what: String) async throws {
    var body: [UInt8] = []
    appendEscaped(name, to: &body)
    let reply = try await hostRequest(options, #"{"op":"\#(op)","id":"\#(id)","name":\#(String(decoding: body, as: UTF8.self))}"#,
                                      id: id, what)
    printWorker(reply["worker"], json: options.json)
}

/// `fluxctl workers`: the workers fluxd supervises (fluxd --config).
struct Workers: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the workers fluxd supervises: state, pid, restarts, uptime, last exit.",
        discussion: "States: starting, running, backing-off, stopping, stopped, failed. Needs fluxd --config FILE.")
    @OptionGroup var options: GlobalOptions

    func run() async throws {
        let reply = try await hostRequest(options, #"{"op":"workers","id":"w"}"#, id: "w", "waiting for fluxd's workers")
        guard case .array(let workers)? = reply["workers"] else { return }
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
        try await workerRequest(options, op: "restart-worker", id: "r", name: name, "waiting for fluxd to restart \(name)")
    }
}

/// `fluxctl stop NAME`: stops a supervised worker until it is restarted.
struct Stop: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop a worker fluxd supervises (SIGTERM, SIGKILL after its stop timeout); it stays stopped until restarted.")
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The worker's name (as in the config file).") var name: String

    func run() async throws {
        try await workerRequest(options, op: "stop-worker", id: "s", name: name, "waiting for fluxd to stop \(name)")
    }
}
