// The todo example's shared model: the state of the `todos` and `stats` stores, the actions' payloads and their
// type names, and the pure reducer logic. Used by todo-store, stats-store and todo-view (each its own process).

import FluxJSONValue

/// The names of the stores of the todo example.
public enum TodoStores {
    /// The store owning the todo list (todo-store).
    public static let todos = "todos"
    /// The store counting todos (stats-store); it runs after `todos` for every `todo/*` action (waitFor).
    public static let stats = "stats"
}

/// The action types of the todo example (seed 002's `TodoAction` constants, namespaced for the bus).
public enum TodoActions {
    /// The pattern every todo store registers for.
    public static let all = "todo/*"
    /// Adds a todo (`CreateTodo`).
    public static let create = "todo/create"
    /// Renames a todo (`EditTodo`).
    public static let edit = "todo/edit"
    /// Flips a todo's done flag (`ToggleTodo`).
    public static let toggle = "todo/toggle"
    /// Removes a todo (`DeleteTodo`).
    public static let delete = "todo/delete"
    /// Removes every done todo (no payload).
    public static let clearDone = "todo/clear-done"
}

/// One item of the todo list.
public struct Todo: Codable, Equatable, Sendable, Identifiable {
    /// Stable id, given by the store (1, 2, 3 ...; never reused).
    public var id: Int
    /// The text, never blank.
    public var title: String
    /// Whether it is done.
    public var done: Bool
    /// The `seq` of the `todo/create` action that created it.
    public var createdSeq: Int

    public init(id: Int, title: String, done: Bool = false, createdSeq: Int) {
        self.id = id
        self.title = title
        self.done = done
        self.createdSeq = createdSeq
    }
}

/// The full state of the `todos` store (one explicit state type per store, seed 004).
public struct TodoState: Codable, Equatable, Sendable {
    /// The todos, in creation order. A `TrackedArray` (encoded as a plain JSON array): the store publishes a
    /// change of one todo as a patch of that todo, and views decode only the todos a patch touched (SPEC §16).
    public var todos: TrackedArray<Todo>
    /// The id the next created todo gets.
    public var nextID: Int

    public init(todos: TrackedArray<Todo> = [], nextID: Int = 1) {
        self.todos = todos
        self.nextID = nextID
    }

    /// The todo with this id, if any.
    public subscript(id id: Int) -> Todo? { todos.first { $0.id == id } }
}

/// Payload of `todo/create`.
public struct CreateTodo: Codable, Equatable, Sendable {
    /// The action type this payload goes with.
    public static let type = TodoActions.create
    /// The new todo's text.
    public var title: String
    public init(title: String) { self.title = title }
}

/// Payload of `todo/edit`.
public struct EditTodo: Codable, Equatable, Sendable {
    /// The action type this payload goes with.
    public static let type = TodoActions.edit
    /// The todo to rename.
    public var id: Int
    /// Its new text.
    public var title: String
    public init(id: Int, title: String) {
        self.id = id
        self.title = title
    }
}

/// Payload of `todo/toggle`.
public struct ToggleTodo: Codable, Equatable, Sendable {
    /// The action type this payload goes with.
    public static let type = TodoActions.toggle
    /// The todo to flip.
    public var id: Int
    public init(id: Int) { self.id = id }
}

/// Payload of `todo/delete`.
public struct DeleteTodo: Codable, Equatable, Sendable {
    /// The action type this payload goes with.
    public static let type = TodoActions.delete
    /// The todo to remove.
    public var id: Int
    public init(id: Int) { self.id = id }
}

/// Why the todo reducer refused an action: a stable code (sent as the store's `reject` code) and a message.
public struct TodoRejection: Error, Equatable, Sendable, CustomStringConvertible {
    /// `todo/not-found`: edit/toggle/delete of an id that is not in the list.
    public static let notFoundCode = "todo/not-found"
    /// `todo/empty-title`: create/edit with a blank title.
    public static let emptyTitleCode = "todo/empty-title"

    /// The stable code.
    public var code: String
    /// Human-readable detail.
    public var message: String

    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }

    static func notFound(_ id: Int) -> TodoRejection {
        TodoRejection(code: notFoundCode, message: "no todo with id \(id)")
    }

    static let emptyTitle = TodoRejection(code: emptyTitleCode, message: "the title is blank")

    public var description: String { "\(code): \(message)" }
}

extension TodoState {
    /// `todo/create`: appends a todo with the next id. The title is trimmed; a blank one is refused.
    @discardableResult
    public mutating func create(title: String, seq: Int) throws(TodoRejection) -> Todo {
        let title = try Self.validTitle(title)
        let todo = Todo(id: nextID, title: title, createdSeq: seq)
        nextID += 1
        todos.append(todo)
        return todo
    }

    /// `todo/edit`: renames a todo.
    public mutating func edit(id: Int, title: String) throws(TodoRejection) {
        let title = try Self.validTitle(title)
        let index = try index(of: id)
        todos[index].title = title
    }

    /// `todo/toggle`: flips a todo's done flag; returns the new value.
    @discardableResult
    public mutating func toggle(id: Int) throws(TodoRejection) -> Bool {
        let index = try index(of: id)
        todos[index].done.toggle()
        return todos[index].done
    }

    /// `todo/delete`: removes a todo.
    public mutating func delete(id: Int) throws(TodoRejection) {
        todos.remove(at: try index(of: id))
    }

    /// `todo/clear-done`: removes every done todo; returns how many.
    @discardableResult
    public mutating func clearDone() -> Int {
        let before = todos.count
        todos.removeAll { $0.done }
        return before - todos.count
    }

    private func index(of id: Int) throws(TodoRejection) -> Int {
        guard let index = todos.firstIndex(where: { $0.id == id }) else { throw .notFound(id) }
        return index
    }

    private static func validTitle(_ title: String) throws(TodoRejection) -> String {
        let trimmed = title.trimmingWhitespace()
        guard !trimmed.isEmpty else { throw .emptyTitle }
        return trimmed
    }
}

/// The full state of the `stats` store: counts derived from the `todos` store's snapshot.
public struct StatsState: Codable, Equatable, Sendable {
    /// Number of todos.
    public var total: Int
    /// Number of done todos.
    public var done: Int
    /// Number of todos not done.
    public var open: Int
    /// The version of the `todos` snapshot these counts were computed from (0 = none seen yet).
    public var todosVersionSeen: Int
    /// The seq of the last action this store handled (0 = none).
    public var lastSeq: Int

    public init(total: Int = 0, done: Int = 0, open: Int = 0, todosVersionSeen: Int = 0, lastSeq: Int = 0) {
        self.total = total
        self.done = done
        self.open = open
        self.todosVersionSeen = todosVersionSeen
        self.lastSeq = lastSeq
    }

    /// The counts of `todos` (a snapshot at `version`), after handling action `lastSeq`.
    public init(counting todos: TodoState, version: Int, lastSeq: Int) {
        let done = todos.todos.count { $0.done }
        self.init(total: todos.todos.count, done: done, open: todos.todos.count - done,
                  todosVersionSeen: version, lastSeq: lastSeq)
    }
}

extension String {
    /// The string without leading and trailing spaces, tabs and newlines.
    func trimmingWhitespace() -> String {
        let isSpace: (Character) -> Bool = { $0.isWhitespace }
        guard let first = firstIndex(where: { !isSpace($0) }), let last = lastIndex(where: { !isSpace($0) }) else {
            return ""
        }
        return String(self[first...last])
    }
}
