import FluxClient
import Foundation
import TodoModel

/// What todo-view shows: the latest `todos` and `stats` snapshots and the stores' liveness, rendered as text.
///
/// On a terminal every render clears the screen and ends with the last error and a prompt. Otherwise (a pipe, a
/// test) each render is printed after a `--- version N ---` line (N = the `todos` version), identical consecutive
/// renders are skipped, and error lines are printed where they happen.
actor TodoScreen {
    private let tty: Bool
    private var todos: Snapshot<TodoState>?
    private var stats: Snapshot<StatsState>?
    private var todosStatus = "connecting"
    private var statsStatus = "connecting"
    private var lastError: String?
    private var lastRender: String?
    private var renderedTodos = 0
    private var renderedStats = 0
    /// Whether each subscription has delivered its initial state (nothing is rendered before both have).
    private var todosSettled = false
    private var statsSettled = false
    private var lost = false

    init(tty: Bool) {
        self.tty = tty
    }

    // MARK: Events

    func todosEvent(_ event: StoreEvent<TodoState>) {
        switch event {
        case .subscribed(let status):
            todosStatus = status.rawValue
            if status == .up { return } // Its retained snapshot follows at once.
            todosSettled = true
        case .snapshot(let snapshot):
            todos = snapshot
            todosSettled = true
        case .storeDown(let reason):
            todosStatus = "down (\(reason))"
        case .storeUp:
            todosStatus = "up"
        }
        render()
        renderedTodos = todos?.version ?? 0
    }

    func statsEvent(_ event: StoreEvent<StatsState>) {
        switch event {
        case .subscribed(let status):
            statsStatus = status.rawValue
            if status == .up { return }
            statsSettled = true
        case .snapshot(let snapshot):
            stats = snapshot
            statsSettled = true
        case .storeDown(let reason):
            statsStatus = "down (\(reason))"
        case .storeUp:
            statsStatus = "up"
        }
        render()
        renderedStats = stats?.version ?? 0
    }

    /// Shows an error line (red on a terminal).
    func error(_ text: String) {
        let line = "error: \(text)"
        if tty {
            lastError = line
            lastRender = nil
            render()
        } else {
            Console.out(line + "\n")
        }
    }

    /// Reports that the connection to fluxd is gone (once, whichever subscription noticed first) and exits 1.
    func connectionLost(_ error: any Error) {
        guard !lost else { return }
        lost = true
        self.error("connection to fluxd lost: \(error)")
        exit(1)
    }

    /// Shows an informational line.
    func note(_ text: String) {
        if tty {
            lastError = nil
            lastRender = nil
            render()
        }
        Console.out(text + "\n")
    }

    /// Forgets the error shown at the bottom of the terminal screen (after a command that worked).
    func clearError() {
        guard tty, lastError != nil else { return }
        lastError = nil
        lastRender = nil
        render()
    }

    /// Whether the snapshots at (at least) these versions have been rendered.
    func hasRendered(todos: Int, stats: Int) -> Bool {
        renderedTodos >= todos && renderedStats >= stats
    }

    // MARK: Rendering

    /// Renders once (used by `--once`).
    func renderOnce(todos: Snapshot<TodoState>?, stats: Snapshot<StatsState>?, todosStatus: String, statsStatus: String) {
        self.todos = todos
        self.stats = stats
        self.todosStatus = todosStatus
        self.statsStatus = statsStatus
        let body = Self.body(todos: todos, stats: stats, todosStatus: todosStatus, statsStatus: statsStatus, color: tty)
        Console.out(tty ? body : "--- version \(todos?.version ?? 0) ---\n" + body)
    }

    private func render() {
        guard todosSettled && statsSettled else { return }
        // Each store's events come on their own subscription, consumed by their own task, so a stats snapshot can
        // be handled before the todos snapshot it was computed from (which fluxd sent first, R3). Wait for it
        // rather than show counts that do not match the list.
        if let seen = stats?.state.todosVersionSeen, let shown = todos?.version, seen > shown { return }
        let body = Self.body(todos: todos, stats: stats, todosStatus: todosStatus, statsStatus: statsStatus, color: tty)
        guard body != lastRender else { return }
        lastRender = body
        if tty {
            var screen = Console.clearScreen + body
            if let lastError { screen += Console.red(lastError, enabled: true) + "\n" }
            screen += Console.dim("commands: add TEXT | edit ID TEXT | toggle ID | delete ID | clear | quit", enabled: true)
            screen += "\n> "
            Console.out(screen)
        } else {
            Console.out("--- version \(todos?.version ?? 0) ---\n" + body)
        }
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
