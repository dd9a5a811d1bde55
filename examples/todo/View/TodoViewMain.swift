import ArgumentParser
import ExampleSupport
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

    @OptionGroup var connection: ConnectionOptions

    @Flag(name: .long, help: "Render the current state once and exit.")
    var once = false

    @Option(name: .long, help: "The todos store to show.")
    var todos: String = TodoStores.todos

    @Option(name: .long, help: "The stats store to show.")
    var stats: String = TodoStores.stats

    func run() async throws {
        ExampleLogging.bootstrap()
        let client = try await ViewProcess.connect(connection, name: "todo-view")
        let screen = TodoScreen(tty: Console.stdoutIsTTY)
        if once {
            let (todos, todosStatus) = await Self.current(client, todos, as: TodoState.self)
            let (stats, statsStatus) = await Self.current(client, stats, as: StatsState.self)
            await screen.renderOnce(todos: todos, stats: stats, todosStatus: todosStatus, statsStatus: statsStatus)
            await client.close()
            return
        }

        let tasks = [
            ViewProcess.follow(client.subscribe(store: todos, as: TodoState.self), on: screen) { await screen.todosEvent($0) },
            ViewProcess.follow(client.subscribe(store: stats, as: StatsState.self), on: screen) { await screen.statsEvent($0) },
            ViewProcess.showErrors(of: client, on: screen),
            Self.showConnectivity(of: client, on: screen),
        ]
        await ViewProcess.readCommands(Command.self) { await perform($0, client: client, screen: screen) }
        for task in tasks { task.cancel() }
        await client.close()
    }

    /// Tells the user when fluxd goes away and comes back (the client reconnects by itself; the subscriptions go on
    /// from where they were, each version shown once).
    static func showConnectivity(of client: FluxClient, on screen: TodoScreen) -> Task<Void, Never> {
        let events = client.connectivityEvents()
        return Task {
            for await event in events {
                switch event {
                case .disconnected(let reason): await screen.note("fluxd went away (\(reason)); reconnecting…")
                case .reconnecting(let attempt, _) where attempt % 10 == 0: await screen.note("still reconnecting (attempt \(attempt))…")
                case .reconnecting: break
                case .reconnected: await screen.note("reconnected to fluxd")
                case .gaveUp(let error): await screen.connectionLost(error)
                }
            }
        }
    }

    /// A store's retained snapshot and status, for `--once`.
    private static func current<S: Decodable & Sendable>(
        _ client: FluxClient, _ store: String, as type: S.Type
    ) async -> (Snapshot<S>?, String) {
        do {
            let snapshot = try await client.get(store: store, as: S.self)
            let status = (try? await client.info())?[store: store]?.status ?? "up"
            return (snapshot, status)
        } catch where error.code == .unknownStore {
            return (nil, "unknown")
        } catch {
            return (nil, "unreadable: \(error)")
        }
    }

    /// Dispatches one command with settlement, reports refusals, and waits until its effects are rendered.
    private func perform(_ command: Command, client: FluxClient, screen: TodoScreen) async {
        let dispatch: () async throws -> Settlement
        switch command {
        case .usage(let text):
            await screen.error("usage: \(text)")
            return
        case .help:
            await screen.note(TodoScreen.commands)
            return
        case .quit:
            return
        case .add(let title):
            dispatch = { try await client.dispatchAndSettle(type: CreateTodo.type, payload: CreateTodo(title: title)) }
        case .edit(let id, let title):
            dispatch = { try await client.dispatchAndSettle(type: EditTodo.type, payload: EditTodo(id: id, title: title)) }
        case .toggle(let id):
            dispatch = { try await client.dispatchAndSettle(type: ToggleTodo.type, payload: ToggleTodo(id: id)) }
        case .delete(let id):
            dispatch = { try await client.dispatchAndSettle(type: DeleteTodo.type, payload: DeleteTodo(id: id)) }
        case .clear:
            dispatch = { try await client.dispatchAndSettle(type: TodoActions.clearDone) }
        }
        guard let settlement = await ViewProcess.settle(on: screen, dispatch) else { return }
        let todosVersion = settlement.doneVersion(todos) ?? 0
        let statsVersion = settlement.doneVersion(stats) ?? 0
        await ViewProcess.waitUntil { await screen.hasRendered(todos: todosVersion, stats: statsVersion) }
    }
}

/// One line of user input.
enum Command: ViewCommand {
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
