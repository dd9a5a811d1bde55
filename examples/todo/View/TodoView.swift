import ExampleSupport
import FluxClient
import Foundation
import TodoModel

/// What todo-view shows: the latest `todos` and `stats` snapshots and the stores' liveness, rendered as text.
///
/// Renders go through `ScreenOutput` (the N of `--- version N ---` is the `todos` version); nothing is rendered
/// before both subscriptions have delivered their initial state.
actor TodoScreen: ViewScreen {
    var output: ScreenOutput
    private var todos = StoreFeed<TodoState>()
    private var stats = StoreFeed<StatsState>()
    private var renderedTodos = 0
    private var renderedStats = 0

    init(tty: Bool) {
        output = ScreenOutput(tty: tty, commands: TodoScreen.commands)
    }

    /// The commands line (shown under every render on a terminal, and by `help`).
    static let commands = "commands: add TEXT | edit ID TEXT | toggle ID | delete ID | clear | quit"

    // MARK: Events

    func todosEvent(_ event: StoreEvent<TodoState>) {
        guard todos.apply(event) else { return }
        render()
        renderedTodos = todos.version
    }

    func statsEvent(_ event: StoreEvent<StatsState>) {
        guard stats.apply(event) else { return }
        render()
        renderedStats = stats.version
    }

    /// Whether the snapshots at (at least) these versions have been rendered.
    func hasRendered(todos: Int, stats: Int) -> Bool {
        renderedTodos >= todos && renderedStats >= stats
    }

    // MARK: Rendering

    /// Renders once (used by `--once`).
    func renderOnce(todos: Snapshot<TodoState>?, stats: Snapshot<StatsState>?, todosStatus: String, statsStatus: String) {
        let body = Self.body(
            todos: todos, stats: stats, todosStatus: todosStatus, statsStatus: statsStatus, color: output.tty)
        output.showOnce(body, version: todos?.version ?? 0)
    }

    func render() {
        // Nothing is rendered before both subscriptions have delivered their initial state.
        guard todos.settled && stats.settled else { return }
        // Each store's events come on their own subscription, consumed by their own task, so a stats snapshot can
        // be handled before the todos snapshot it was computed from (which fluxd sent first, R3). Wait for it
        // rather than show counts that do not match the list.
        if let seen = stats.snapshot?.state.todosVersionSeen, let shown = todos.snapshot?.version, seen > shown { return }
        let body = Self.body(
            todos: todos.snapshot, stats: stats.snapshot, todosStatus: todos.status, statsStatus: stats.status,
            color: output.tty)
        output.show(body, version: todos.version)
    }

    /// The text of one render: a header, one line per todo (`id [x] title`), and the stats line.
    static func body(
        todos: Snapshot<TodoState>?, stats: Snapshot<StatsState>?, todosStatus: String, statsStatus: String, color: Bool
    ) -> String {
        var out = ""
        if let todos {
            out += "todos (version \(todos.version), seq \(todos.seq))"
            if todosStatus != "up" { out += " [store \(todosStatus)]" }
            out += "\n"
            if todos.state.todos.isEmpty { out += "  (nothing to do)\n" }
            let width = String(todos.state.todos.map(\.id).max() ?? 0).count
            for todo in todos.state.todos {
                let id = String(repeating: " ", count: width - String(todo.id).count) + String(todo.id)
                let line = "  \(id) \(todo.done ? "[x]" : "[ ]") \(todo.title)"
                out += (todo.done ? Console.dim(line, enabled: color) : line) + "\n"
            }
        } else {
            out += "todos: no snapshot yet (store \(todosStatus == "unknown" ? "not registered" : todosStatus))\n"
        }
        if let stats {
            let s = stats.state
            out += "stats: \(s.total) total, \(s.done) done, \(s.open) open"
            out += " (from todos v\(s.todosVersionSeen), stats v\(stats.version))"
            if statsStatus != "up" { out += " [store \(statsStatus)]" }
            out += "\n"
        } else {
            out += "stats: none (store \(statsStatus == "unknown" ? "not registered" : statsStatus))\n"
        }
        return out
    }
}
