import FluxCore
import FluxRouter
import Foundation
import Glibc
import TOMLKit

/// When a worker that ended is started again.
public enum RestartPolicy: String, Sendable, Equatable, CaseIterable {
    /// Whatever the way it ended (also exit status 0).
    case always
    /// Unless it exited with status 0 (a crash, a signal, a missed start timeout or a lost connection restart it).
    case onFailure = "on-failure"
    /// Never: it stays stopped (exit 0) or failed.
    case never
}

/// Delay before restart number n (counted since the worker last ran long enough): `initial * factor^(n-1)`, at most
/// `cap`.
public struct Backoff: Sendable, Equatable {
    public var initial: Millis = 200
    public var factor: Double = 2
    public var cap: Millis = 10_000

    public init() {}

    /// The delay before the `attempt`-th consecutive restart (1-based).
    public func delay(attempt: Int) -> Millis {
        var delay = Double(initial)
        if attempt > 1 { delay *= pow(factor, Double(min(attempt - 1, 64))) }
        return Millis(min(delay, Double(cap)))
    }
}

/// The restart intensity limit: more than `maxRestarts` restarts within `window` ms make the supervisor give up on
/// the worker (state `failed`) and report it.
public struct RestartIntensity: Sendable, Equatable {
    public var maxRestarts: Int = 5
    public var window: Millis = 60_000

    public init() {}
}

/// One supervised worker as the config file describes it (compared as a whole on reload: any difference restarts it).
public struct WorkerSpec: Sendable, Equatable {
    /// The worker's name (the table name in `[workers.NAME]`).
    public var name: String
    /// The command as written in the file.
    public var command: String
    /// What is executed: a path for commands with a slash (relative ones taken from the config file's directory),
    /// a file of that name next to the fluxd executable if there is one, else the bare name (looked up in PATH).
    public var executable: String
    /// Arguments (fluxd appends `--socket PATH` unless `socketArgument` is false).
    public var arguments: [String] = []
    /// Working directory (relative ones taken from the config file's directory); nil: fluxd's.
    public var workingDirectory: String?
    /// Added to (or overriding) fluxd's environment; `FLUXBUS_SOCKET` is always set.
    public var environment: [String: String] = [:]
    /// The stores the worker must register (it counts as running once they are all up).
    public var stores: [String] = []
    /// Stores that must be up before the worker is started (dependencies).
    public var after: [String] = []
    public var restart: RestartPolicy = .onFailure
    public var backoff = Backoff()
    public var intensity = RestartIntensity()
    /// How long the worker has to register its stores after it was started; then it is killed.
    public var startTimeout: Millis = 10_000
    /// How long a worker has to exit after SIGTERM; then SIGKILL.
    public var stopTimeout: Millis = 5_000
    /// Whether `--socket PATH` is appended to the arguments.
    public var socketArgument = true

    public init(name: String, command: String, executable: String) {
        self.name = name
        self.command = command
        self.executable = executable
    }
}

/// The whole config file: daemon settings and the workers in start (dependency) order.
public struct SupervisorConfig: Sendable, Equatable {
    /// The file it was read from.
    public var path: String
    /// The workers, every worker after the workers that provide the stores it depends on.
    public var workers: [WorkerSpec] = []
    /// How long a SIGTERM/SIGINT shutdown waits for in-flight actions to settle.
    public var drainTimeout: Millis = 5_000
    /// `admin_users` and `admin_groups` of `[fluxd]`, resolved to ids: who, besides fluxd's own user and root, may
    /// send the privileged operations (restart and stop workers, read the journal).
    public var adminUIDs: Set<UInt32> = []
    public var adminGIDs: Set<UInt32> = []
    /// Every key the file's `[fluxd]` table sets (the options in `settings` and the host's own keys:
    /// `drain_timeout`, `admin_users`, `admin_groups`), sorted: what `--check-config` counts.
    public var fluxdKeys: [String] = []
    /// The other keys of `[fluxd]`: fluxd's command-line options (`DaemonSettings.keys`), each as the text of its
    /// argument (relative paths made absolute against the file's directory; booleans `true`/`false`).
    public var settings: [String: String] = [:]

    public init(path: String) {
        self.path = path
    }
}

/// A config file fluxd cannot use: which file, where (line and/or key) and what is wrong.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public var file: String
    public var line: Int?
    public var column: Int?
    /// The dotted key path, e.g. `workers.todo.restart`.
    public var key: String?
    public var problem: String

    public var description: String {
        var location = file
        if let line {
            location += ":\(line)"
            if let column { location += ":\(column)" }
        }
        if let key { return "\(location): \(key): \(problem)" }
        return "\(location): \(problem)"
    }
}

extension SupervisorConfig {
    /// Reads and checks a config file. `executableDirectory` is where bare command names are looked for first
    /// (fluxd's own directory, where `swift build` puts the example stores).
    public static func load(path: String, executableDirectory: String?) throws(ConfigError) -> SupervisorConfig {
        try parse(text: readText(path: path), path: path, executableDirectory: executableDirectory)
    }

    /// The most a config file may hold: reading and parsing it is work fluxd does on a `reload` (issue 25).
    public static let maxBytes = 1 << 20

    /// The file's text: a regular file (a FIFO, a device or a directory is refused for what it is, without
    /// reading it: opened non-blocking, so a FIFO with no writer cannot hang fluxd), at most `maxBytes`, UTF-8.
    public static func readText(path: String) throws(ConfigError) -> String {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            throw ConfigError(file: path, problem: "cannot read the file: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            throw ConfigError(file: path, problem: "cannot read the file: \(String(cString: strerror(errno)))")
        }
        let type = info.st_mode & S_IFMT
        guard type == S_IFREG else {
            let what = type == S_IFDIR ? "a directory" : type == S_IFIFO ? "a FIFO" : type == S_IFCHR || type == S_IFBLK ? "a device" : type == S_IFSOCK ? "a socket" : "not a file"
            throw ConfigError(file: path, problem: "not a regular file (it is \(what)): a config file must be a regular file")
        }
        guard info.st_size <= maxBytes else {
            throw ConfigError(file: path, problem: "the file has \(info.st_size) bytes; a config file may have at most \(maxBytes) (1 MiB)")
        }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size) + 1)
        var count = 0
        while count < bytes.count {
            let n = bytes[count...].withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw ConfigError(file: path, problem: "cannot read the file: \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            count += n
            if count > maxBytes {
                throw ConfigError(file: path, problem: "the file grew past \(maxBytes) bytes while being read; a config file may have at most 1 MiB")
            }
            if count == bytes.count { bytes += [UInt8](repeating: 0, count: min(maxBytes + 1 - count + 1, 65536)) }
        }
        guard let text = String(validating: bytes[..<count], as: UTF8.self) else {
            throw ConfigError(file: path, problem: "not UTF-8 text")
        }
        return text
    }

    /// Parses config text (`path` names it in errors and anchors relative paths).
    public static func parse(text: String, path: String, executableDirectory: String?) throws(ConfigError) -> SupervisorConfig {
        let table: TOMLTable
        do {
            table = try TOMLTable(string: text)
        } catch let error as TOMLParseError {
            throw ConfigError(file: path, line: error.source.begin.line, column: error.source.begin.column,
                              problem: "not valid TOML: \(error.description)")
        } catch {
            throw ConfigError(file: path, problem: "not valid TOML: \(error)")
        }
        var parser = ConfigParser(path: path, lines: text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init),
                                  executableDirectory: executableDirectory)
        return try parser.config(table)
    }
}

extension SupervisorConfig {
    /// Every problem of config text in one pass (`--check-config`), each with its file, line and key, at most
    /// `limit` of them. A TOML syntax error is reported and its line left out, then the text is parsed again (so a
    /// second broken line is found too; what follows a skipped line may be read differently, as the message
    /// after it says); a problem of a key is reported and that key (or, for a missing one, the table that misses
    /// it) left out, then the checks run again. `config` is what the file gives without the problems: complete
    /// when `errors` is empty, else what remains (its workers' commands can still be checked, `startProblems`).
    public static func check(text: String, path: String, executableDirectory: String?,
                             limit: Int = 50) -> (config: SupervisorConfig?, errors: [ConfigError]) {
        var errors: [ConfigError] = []
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        var table: TOMLTable?
        while table == nil && errors.count < limit {
            do {
                table = try TOMLTable(string: lines.joined(separator: "\n"))
            } catch let error as TOMLParseError {
                let line = error.source.begin.line
                errors.append(ConfigError(file: path, line: line, column: error.source.begin.column,
                                          problem: "not valid TOML: \(error.description)\(errors.isEmpty ? "" : " (read with the lines above left out)")"))
                guard line >= 1, line <= lines.count, lines[line - 1] != "", !lines[line - 1].hasPrefix(Self.skipped) else {
                    return (nil, errors)
                }
                // A broken table header becomes a table of its own, left out below, so that the keys after it are
                // not read as the previous table's.
                let header = lines[line - 1].trimmingCharacters(in: .whitespaces).hasPrefix("[")
                lines[line - 1] = header ? "[\(Self.skipped)\(line)]" : ""
            } catch {
                errors.append(ConfigError(file: path, problem: "not valid TOML: \(error)"))
                return (nil, errors)
            }
        }
        guard let table else { return (nil, errors) }
        while errors.count < limit {
            var parser = ConfigParser(path: path, lines: lines, executableDirectory: executableDirectory)
            do {
                return (try parser.config(table), errors)
            } catch {
                let key = error.key?.split(separator: ".").map(String.init)
                if key?.first?.hasPrefix(Self.skipped) != true { errors.append(error) }
                guard let key, Self.leaveOut(key, from: table) else { return (nil, errors) }
            }
        }
        return (nil, errors)
    }

    /// The name a broken table header is read as while `check` looks for more problems.
    private static let skipped = "fluxbus-check-skipped-line-"

    /// Removes the deepest part of `key` that `table` holds (never the whole file); whether anything was removed.
    private static func leaveOut(_ key: [String], from root: TOMLTable) -> Bool {
        var tables: [TOMLTable] = [root]
        var found = 0
        for component in key.dropLast() {
            guard let next = tables.last?[component]?.tomlValue.table else { break }
            tables.append(next)
            found += 1
        }
        if found == key.count - 1, tables.last?.remove(at: key[key.count - 1]) != nil { return true }
        // The key itself is missing (a required key): leave out the table that misses it.
        guard found >= 1 else { return false }
        return tables[found - 1].remove(at: key[found - 1]) != nil
    }

    /// What a start of fluxd with this config would run into beyond the file itself (`--check-config`): every
    /// worker whose command is not an executable file, resolved as a start resolves it (a path, relative to the
    /// file's folder; a bare name next to fluxd, else in `searchPath`, the `PATH` fluxd starts its workers with).
    /// (An `after` store no worker provides is an error of the file itself, `parse`.) `text` is the file's text, for
    /// line numbers.
    public func startProblems(text: String, searchPath: String?) -> [ConfigError] {
        let parser = ConfigParser(path: path, lines: text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init),
                                  executableDirectory: nil)
        return workers.compactMap { worker in
            guard !Self.isExecutable(worker.executable, searchPath: searchPath) else { return nil }
            let looked = worker.executable.contains("/") ? worker.executable : "next to fluxd or in PATH (\(searchPath ?? "unset"))"
            return parser.fail(["workers", worker.name, "command"], "\"\(worker.command)\" is not an executable file (looked for: \(looked))")
        }
    }

    /// Whether `executable` names an executable regular file: a path as it is, a bare name in `searchPath`.
    static func isExecutable(_ executable: String, searchPath: String?) -> Bool {
        func check(_ path: String) -> Bool {
            var st = stat()
            return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG && access(path, X_OK) == 0
        }
        if executable.contains("/") { return check(executable) }
        for dir in (searchPath ?? "").split(separator: ":", omittingEmptySubsequences: false) {
            if check((dir.isEmpty ? "." : String(dir)) + "/" + executable) { return true }
        }
        return false
    }
}

/// Turns the TOML tree into a `SupervisorConfig`, with errors that point at the key (and its line).
private struct ConfigParser {
    let path: String
    let lines: [String]
    let executableDirectory: String?
    var baseDirectory: String { (absolute(path) as NSString).deletingLastPathComponent }

    func fail(_ key: [String], _ problem: String) -> ConfigError {
        ConfigError(file: path, line: line(of: key), key: key.joined(separator: "."), problem: problem)
    }

    mutating func config(_ root: TOMLTable) throws(ConfigError) -> SupervisorConfig {
        var config = SupervisorConfig(path: path)
        try onlyKeys(root, [], ["fluxd", "workers"])
        if let fluxd = root["fluxd"] {
            let table = try self.table(fluxd, ["fluxd"])
            try onlyKeys(table, ["fluxd"], ["drain_timeout", "admin_users", "admin_groups"] + DaemonSettings.keys.keys.sorted())
            config.fluxdKeys = table.keys.sorted()
            for (key, kind) in DaemonSettings.keys {
                guard let value = table[key] else { continue }
                let at = ["fluxd", key]
                switch kind.type {
                case .string:
                    config.settings[key] = try string(value, at)
                case .path:
                    let path = try string(value, at)
                    guard !path.isEmpty else { throw fail(at, "must not be empty") }
                    config.settings[key] = path.hasPrefix("/") ? path : baseDirectory + "/" + path
                case .integer:
                    guard value.type == .int, let n = value.int else {
                        throw fail(at, "must be a non-negative integer, not \(describe(value))")
                    }
                    guard n >= 0 else { throw fail(at, "must not be negative (got \(n))") }
                    config.settings[key] = "\(n)"
                case .bool:
                    guard value.type == .bool, let b = value.bool else { throw fail(at, "must be true or false, not \(describe(value))") }
                    config.settings[key] = b ? "true" : "false"
                }
            }
            if let value = table["drain_timeout"] { config.drainTimeout = try duration(value, ["fluxd", "drain_timeout"]) }
            if let value = table["admin_users"] {
                config.adminUIDs = try ids(value, ["fluxd", "admin_users"], kind: "user") { name in
                    getpwnam(name).map { $0.pointee.pw_uid }
                }
            }
            if let value = table["admin_groups"] {
                config.adminGIDs = try ids(value, ["fluxd", "admin_groups"], kind: "group") { name in
                    getgrnam(name).map { $0.pointee.gr_gid }
                }
            }
        }
        guard let workersValue = root["workers"] else { return config }  // fluxd settings only: no workers
        let workers = try table(workersValue, ["workers"])
        var specs: [WorkerSpec] = []
        for name in workers.keys.sorted() {
            specs.append(try worker(name: name, workers[name]!))
        }
        config.workers = try ordered(specs)
        return config
    }

    static let workerKeys = ["command", "args", "cwd", "env", "stores", "after", "restart", "backoff", "intensity",
                             "start_timeout", "stop_timeout", "socket_arg"]

    func worker(name: String, _ value: any TOMLValueConvertible) throws(ConfigError) -> WorkerSpec {
        let at = ["workers", name]
        guard Names.isValidWorker(name) else {
            throw fail(at, "a worker name is 1 to 64 letters, digits, '-', '_' or '.'")
        }
        let table = try self.table(value, at)
        try onlyKeys(table, at, Self.workerKeys)
        guard let commandValue = table["command"] else { throw fail(at, "missing key 'command' (the executable to run)") }
        let command = try string(commandValue, at + ["command"])
        guard !command.isEmpty else { throw fail(at + ["command"], "must not be empty") }
        var spec = WorkerSpec(name: name, command: command, executable: resolve(command: command))
        if let v = table["args"] { spec.arguments = try strings(v, at + ["args"]) }
        if let v = table["cwd"] {
            let cwd = try string(v, at + ["cwd"])
            spec.workingDirectory = cwd.hasPrefix("/") ? cwd : baseDirectory + "/" + cwd
        }
        if let v = table["env"] {
            let env = try self.table(v, at + ["env"])
            for key in env.keys.sorted() {
                guard !key.isEmpty, !key.contains("=") else { throw fail(at + ["env", key], "not a valid variable name") }
                spec.environment[key] = try string(env[key]!, at + ["env", key])
            }
        }
        if let v = table["stores"] {
            spec.stores = try strings(v, at + ["stores"])
            for store in spec.stores where !Names.isValidStore(store) {
                throw fail(at + ["stores"], "'\(store)' is not a valid store name (1-128 bytes of A-Z a-z 0-9 . _ : / -, SPEC §4.1)")
            }
            if Set(spec.stores).count != spec.stores.count { throw fail(at + ["stores"], "lists a store twice") }
        }
        if let v = table["after"] { spec.after = try strings(v, at + ["after"]) }
        if let v = table["restart"] {
            let text = try string(v, at + ["restart"])
            guard let policy = RestartPolicy(rawValue: text) else {
                throw fail(at + ["restart"], "must be one of always, on-failure, never (got \"\(text)\")")
            }
            spec.restart = policy
        }
        if let v = table["backoff"] {
            let b = try self.table(v, at + ["backoff"])
            try onlyKeys(b, at + ["backoff"], ["initial", "factor", "max"])
            if let x = b["initial"] { spec.backoff.initial = try duration(x, at + ["backoff", "initial"]) }
            if let x = b["factor"] {
                spec.backoff.factor = try number(x, at + ["backoff", "factor"])
                guard spec.backoff.factor >= 1, spec.backoff.factor <= 100 else {
                    throw fail(at + ["backoff", "factor"], "must be between 1 and 100")
                }
            }
            if let x = b["max"] { spec.backoff.cap = try duration(x, at + ["backoff", "max"]) }
            guard spec.backoff.cap >= spec.backoff.initial else {
                throw fail(at + ["backoff", "max"], "must not be below backoff.initial")
            }
        }
        if let v = table["intensity"] {
            let t = try self.table(v, at + ["intensity"])
            try onlyKeys(t, at + ["intensity"], ["restarts", "within"])
            if let x = t["restarts"] {
                guard let n = x.int, x.type == .int, n >= 0 else {
                    throw fail(at + ["intensity", "restarts"], "must be a whole number of restarts, 0 or more")
                }
                spec.intensity.maxRestarts = n
            }
            if let x = t["within"] {
                spec.intensity.window = try duration(x, at + ["intensity", "within"])
                guard spec.intensity.window > 0 else { throw fail(at + ["intensity", "within"], "must be above 0") }
            }
        }
        if let v = table["start_timeout"] {
            spec.startTimeout = try duration(v, at + ["start_timeout"])
            guard spec.startTimeout > 0 else { throw fail(at + ["start_timeout"], "must be above 0") }
        }
        if let v = table["stop_timeout"] { spec.stopTimeout = try duration(v, at + ["stop_timeout"]) }
        if let v = table["socket_arg"] {
            guard let b = v.bool, v.type == .bool else { throw fail(at + ["socket_arg"], "must be true or false") }
            spec.socketArgument = b
        }
        return spec
    }

    /// Dependency order (providers first, else by name); rejects a store provided twice, an unknown dependency and
    /// cycles.
    func ordered(_ specs: [WorkerSpec]) throws(ConfigError) -> [WorkerSpec] {
        var provider: [String: String] = [:]
        for spec in specs {
            for store in spec.stores {
                if let other = provider[store] {
                    throw fail(["workers", spec.name, "stores"], "store '\(store)' is already provided by worker '\(other)'")
                }
                provider[store] = spec.name
            }
        }
        var dependsOn: [String: Set<String>] = [:]
        for spec in specs {
            var workers = Set<String>()
            for store in spec.after {
                guard let name = provider[store] else {
                    throw fail(["workers", spec.name, "after"],
                               "store '\(store)' is not provided by any worker (list it under some worker's stores)")
                }
                if name == spec.name { throw fail(["workers", spec.name, "after"], "the worker waits for its own store '\(store)'") }
                workers.insert(name)
            }
            dependsOn[spec.name] = workers
        }
        var result: [WorkerSpec] = []
        var placed = Set<String>()
        var remaining = specs
        while !remaining.isEmpty {
            guard let index = remaining.firstIndex(where: { dependsOn[$0.name]!.isSubset(of: placed) }) else {
                let names = remaining.map(\.name).sorted().joined(separator: ", ")
                throw fail(["workers", remaining.map(\.name).sorted()[0], "after"],
                           "dependency cycle among workers \(names)")
            }
            placed.insert(remaining[index].name)
            result.append(remaining.remove(at: index))
        }
        return result
    }

    // MARK: - Values

    func table(_ value: any TOMLValueConvertible, _ key: [String]) throws(ConfigError) -> TOMLTable {
        guard value.type == .table, let table = value.table else { throw fail(key, "must be a table, not \(describe(value))") }
        return table
    }

    func string(_ value: any TOMLValueConvertible, _ key: [String]) throws(ConfigError) -> String {
        guard value.type == .string, let string = value.string else { throw fail(key, "must be a string, not \(describe(value))") }
        return string
    }

    /// An array of user or group names and numeric ids, resolved (a name that does not exist is an error).
    func ids(_ value: any TOMLValueConvertible, _ key: [String], kind: String,
             resolve: (String) -> UInt32?) throws(ConfigError) -> Set<UInt32> {
        guard value.type == .array, let array = value.array else {
            throw fail(key, "must be an array of \(kind) names or ids, not \(describe(value))")
        }
        var result: Set<UInt32> = []
        for (n, element) in array.enumerated() {
            if element.type == .int, let id = element.int, id >= 0, id < Int(UInt32.max) {
                result.insert(UInt32(id))
            } else if element.type == .string, let name = element.string {
                guard let id = resolve(name) else { throw fail(key, "no \(kind) named \"\(name)\" on this machine") }
                result.insert(id)
            } else {
                throw fail(key, "must be an array of \(kind) names or ids; element \(n + 1) is \(describe(element))")
            }
        }
        return result
    }

    func strings(_ value: any TOMLValueConvertible, _ key: [String]) throws(ConfigError) -> [String] {
        guard value.type == .array, let array = value.array else {
            throw fail(key, "must be an array of strings, not \(describe(value))")
        }
        var result: [String] = []
        for element in array {
            guard element.type == .string, let string = element.string else {
                throw fail(key, "must be an array of strings; element \(result.count + 1) is \(describe(element))")
            }
            result.append(string)
        }
        return result
    }

    func number(_ value: any TOMLValueConvertible, _ key: [String]) throws(ConfigError) -> Double {
        switch value.type {
        case .int: return Double(value.int!)
        case .double: return value.double!
        default: throw fail(key, "must be a number, not \(describe(value))")
        }
    }

    /// Seconds (integer or fraction) to milliseconds.
    func duration(_ value: any TOMLValueConvertible, _ key: [String]) throws(ConfigError) -> Millis {
        let seconds = try number(value, key)
        guard seconds.isFinite, seconds >= 0, seconds <= 86_400 * 365 else {
            throw fail(key, "must be a number of seconds between 0 and one year (got \(seconds))")
        }
        return Millis((seconds * 1000).rounded())
    }

    func onlyKeys(_ table: TOMLTable, _ at: [String], _ known: [String]) throws(ConfigError) {
        for key in table.keys.sorted() where !known.contains(key) {
            if let near = nearestKey(key, in: known) {
                throw fail(at + [key], "unknown key; did you mean \(near)?")
            }
            throw fail(at + [key], "unknown key (known here: \(known.joined(separator: ", ")))")
        }
    }

    func describe(_ value: any TOMLValueConvertible) -> String {
        switch value.type {
        case .table: return "a table"
        case .array: return "an array"
        case .string: return "a string"
        case .int: return "an integer"
        case .double: return "a number"
        case .bool: return "a boolean"
        default: return "a date or time"
        }
    }

    func resolve(command: String) -> String {
        if command.contains("/") { return command.hasPrefix("/") ? command : baseDirectory + "/" + command }
        if let executableDirectory {
            let candidate = executableDirectory + "/" + command
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return command
    }

    // MARK: - Lines

    /// The line where `key` (or, failing that, its closest parent) is written, 1-based; nil when not found.
    func line(of key: [String]) -> Int? {
        var path = key
        while !path.isEmpty {
            if let line = findLine(path) { return line }
            path.removeLast()
        }
        return nil
    }

    private func findLine(_ key: [String]) -> Int? {
        var table: [String] = []
        for (index, raw) in lines.enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.hasPrefix("#") || line.isEmpty { continue }
            if line.hasPrefix("[") {
                let inner = line.trimmingCharacters(in: CharacterSet(charactersIn: "[]")).split(separator: "#")[0]
                table = splitKey(String(inner))
                if table == key { return index + 1 }
                continue
            }
            guard let equals = line.firstIndex(of: "=") else { continue }
            let lhs = splitKey(String(line[..<equals]))
            if table + lhs == key { return index + 1 }
        }
        return nil
    }

    private func splitKey(_ text: String) -> [String] {
        text.split(separator: ".").map {
            $0.trimmingCharacters(in: .whitespaces).trimmingCharacters(in: CharacterSet(charactersIn: "\"'"))
        }
    }
}

private func absolute(_ path: String) -> String {
    if path.hasPrefix("/") { return path }
    return FileManager.default.currentDirectoryPath + "/" + path
}

/// The known key nearest to a mistyped one (edit distance at most a third of its length, 1 to 3), if one is clearly
/// nearest: `--check-config` suggests it instead of listing every key.
func nearestKey(_ key: String, in known: [String]) -> String? {
    let limit = min(3, max(1, key.count / 3))
    var best: (key: String, distance: Int)?
    var tie = false
    for candidate in known {
        let d = editDistance(Array(key.utf8), Array(candidate.utf8))
        guard d <= limit else { continue }
        if best == nil || d < best!.distance { best = (candidate, d); tie = false } else if d == best!.distance { tie = true }
    }
    return tie ? nil : best?.key
}
