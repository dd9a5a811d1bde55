import ArgumentParser
import FluxClient
import Foundation
import TodoModel

/// `todo-view`: a terminal view of the todo example (Flux's controller-view, seed 002).
///
/// It subscribes to the `todos` and `stats` stores and re-renders on every snapshot; the commands typed on stdin
/// become actions dispatched with settlement, so refusals (`todo/not-found`, `no-handler` ...) are shown to the
/// user. After each command it waits until the snapshots the settlement names are rendered (read your writes).
@main
struct TodoViewCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "todo-view",
        abstract: "The FluxBus todo example's view: renders the todos and dispatches commands read from stdin.",
        discussion: """
            Commands (one per line): add TEXT, edit ID TEXT, toggle ID, delete ID, clear, quit (end of input \
            quits too). On a terminal the screen is redrawn on every snapshot; otherwise every render is printed \
            after a line "--- version N ---" (N = the todos version).
            """
    )

    @Option(name: .long, help: ArgumentHelp("fluxd's socket (default: the SDK's defaultSocketPath()).", valueName: "path"))
    var socket: String?

    @Flag(name: .long, help: "Render the current state once and exit.")
    var once = false

    @Option(name: .long, help: "The todos store to show.")
    var todos: String = TodoStores.todos

    @Option(name: .long, help: "The stats store to show.")
    var stats: String = TodoStores.stats

    func run() async throws {
        let socketPath = socket ?? defaultSocketPath()
        let client: FluxClient
        do {
            client = try await FluxClient.connect(socketPath: socketPath, name: "todo-view")
        } catch {
            Console.err("todo-view: cannot connect to fluxd at \(socketPath): \(error)\n")
            throw ExitCode.failure
        }
        let screen = TodoScreen(tty: Console.stdoutIsTTY)
        if once {
            let (todos, todosStatus) = await Self.current(client, todos, as: TodoState.self)
            let (stats, statsStatus) = await Self.current(client, stats, as: StatsState.self)
            await screen.renderOnce(todos: todos, stats: stats, todosStatus: todosStatus, statsStatus: statsStatus)
            await client.close()
            return
        }

        let todosStore = todos
        let statsStore = stats
        // A lost connection (fluxd stopped) ends the view.
        let onLost: @Sendable (any Error) async -> Void = { error in await screen.connectionLost(error) }
        let todosTask = Task {
            do {
                for try await event in client.subscribe(store: todosStore, as: TodoState.self) {
                    await screen.todosEvent(event)
                }
            } catch { await onLost(error) }
        }
        let statsTask = Task {
            do {
                for try await event in client.subscribe(store: statsStore, as: StatsState.self) {
                    await screen.statsEvent(event)
                }
            } catch { await onLost(error) }
        }
        let errorsTask = Task {
            for await error in client.errors { await screen.error("\(error)") }
        }

        for await line in Console.stdinLines() {
            guard let command = Command(line) else { continue }
            if case .quit = command { break }
            await perform(command, client: client, screen: screen)
        }

        todosTask.cancel()
        statsTask.cancel()
        errorsTask.cancel()
        await client.close()
    }

    /// A store's retained snapshot and status, for `--once`.
    private static func current<S: Decodable & Sendable>(
        _ client: FluxClient, _ store: String, as type: S.Type
    ) async -> (Snapshot<S>?, String) {
        do {
            let snapshot = try await client.get(store: store, as: S.self)
            let status = (try? await client.info())?[store: store]?.status ?? "up"
            return (snapshot, status)
        } catch let error as FluxError where error.code == .unknownStore {
            return (nil, "unknown")
        } catch {
            return (nil, "unreadable: \(error)")
        }
    }

    /// Dispatches one command with settlement, reports refusals, and waits until its effects are rendered.
    private func perform(_ command: Command, client: FluxClient, screen: TodoScreen) async {
        let settlement: Settlement
        do {
            switch command {
            case .usage(let text):
                await screen.error("usage: \(text)")
                return
            case .help:
                await screen.note("commands: add TEXT | edit ID TEXT | toggle ID | delete ID | clear | quit")
                return
            case .quit:
                return
            case .add(let title):
                settlement = try await client.dispatchAndSettle(type: CreateTodo.type, payload: CreateTodo(title: title))
            case .edit(let id, let title):
                settlement = try await client.dispatchAndSettle(type: EditTodo.type, payload: EditTodo(id: id, title: title))
            case .toggle(let id):
                settlement = try await client.dispatchAndSettle(type: ToggleTodo.type, payload: ToggleTodo(id: id))
            case .delete(let id):
                settlement = try await client.dispatchAndSettle(type: DeleteTodo.type, payload: DeleteTodo(id: id))
            case .clear:
                settlement = try await client.dispatchAndSettle(type: TodoActions.clearDone)
            }
        } catch let error as FluxError {
            if case .server(let e) = error {
                await screen.error("\(e.rawCode): \(e.message)")
            } else {
                await screen.error("\(error)")
            }
            return
        } catch {
            await screen.error("\(error)")
            return
        }

        var failed = false
        for result in settlement.results {
            switch result.status {
            case .done:
                break
            case .rejected(let code, let message):
                failed = true
                await screen.error("\(code): \(message)")
            case .unavailable(let code, let message):
                failed = true
                await screen.error("\(code): \(message) (store \(result.store))")
            }
        }
        if !failed { await screen.clearError() }

        // Read your writes: fluxd sent the snapshots before the settlement (R5); wait until they are on screen.
        func version(_ store: String) -> Int {
            if case .done(let v)? = settlement[store] { return v }
            return 0
        }
        let todosVersion = version(todos)
        let statsVersion = version(stats)
        let deadline = ContinuousClock.now + .seconds(2)
        while await !screen.hasRendered(todos: todosVersion, stats: statsVersion), ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(5))
        }
    }
}

/// One line of user input.
enum Command {
    case add(String)
    case edit(Int, String)
    case toggle(Int)
    case delete(Int)
    case clear
    case quit
    case help
    case usage(String)

    /// Parses a line; nil for a blank one.
    init?(_ line: String) {
        let trimmed = line.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty else { return nil }
        let parts = trimmed.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        let word = parts[0].lowercased()
        let rest = parts.count > 1 ? String(parts[1]).trimmingCharacters(in: .whitespaces) : ""
        func idAndRest() -> (Int, String)? {
            let p = rest.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
            guard let first = p.first, let id = Int(first) else { return nil }
            return (id, p.count > 1 ? String(p[1]) : "")
        }
        switch word {
        case "add", "a":
            self = .add(rest)
        case "edit", "e":
            if let (id, title) = idAndRest() { self = .edit(id, title) } else { self = .usage("edit ID TEXT") }
        case "toggle", "t":
            if let id = Int(rest) { self = .toggle(id) } else { self = .usage("toggle ID") }
        case "delete", "del", "d", "rm":
            if let id = Int(rest) { self = .delete(id) } else { self = .usage("delete ID") }
        case "clear":
            self = .clear
        case "quit", "exit", "q":
            self = .quit
        case "help", "?":
            self = .help
        default:
            self = .usage("unknown command \"\(word)\"; try add TEXT, edit ID TEXT, toggle ID, delete ID, clear, quit")
        }
    }
}
