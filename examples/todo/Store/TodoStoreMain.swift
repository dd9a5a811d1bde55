import ArgumentParser
import ExampleSupport
import FluxClient
import FluxStore
import Foundation
import TodoModel

/// `todo-store`: the process owning the `todos` store (seed 002's TodoStore, seed 004's one explicit state type).
/// Handles `todo/*`; refuses bad actions with stable codes (`todo/not-found`, `todo/empty-title`) that the
/// dispatching view sees in its settlement.
///
/// When fluxd goes away (stopped, restarted, crashed) the store does not exit: it logs that it waits, reconnects
/// with backoff, registers again and resumes from the state fluxd retained (SPEC §15.5).
@main
struct TodoStoreCommand: AsyncParsableCommand {
    static let configuration = StoreProcess.configuration(
        commandName: "todo-store",
        abstract: "The FluxBus todo example's store process: owns the `todos` store."
    )

    @OptionGroup var connection: ConnectionOptions

    @Option(name: .long, help: "The store name to register.")
    var name: String = TodoStores.todos

    func validate() throws {
        guard !name.isEmpty, name.utf8.count <= 128,
              name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "._:/-".contains($0)) }) else {
            throw ValidationError("--name must be 1-128 characters of [A-Za-z0-9._:/-]")
        }
    }

    func run() async throws {
        ExampleLogging.bootstrap()
        let name = self.name
        let store = FluxStore<TodoState>(name: name, initial: TodoState(), handles: [TodoActions.all])
        let storeLog = StoreLog(name)
        let log: @Sendable (ActionContext, String) -> Void = { ctx, what in
            storeLog("seq \(ctx.seq) \(ctx.type) from peer \(ctx.origin)\(ctx.redelivered ? " (redelivered)" : ""): \(what)")
        }
        // Runs the pure reducer; logs its outcome; turns a TodoRejection into the SDK's StoreRejection.
        let reduce: @Sendable (ActionContext, () throws(TodoRejection) -> String) throws -> Void = { ctx, body in
            do throws(TodoRejection) {
                log(ctx, try body())
            } catch {
                log(ctx, "rejected \(error)")
                throw StoreRejection(code: error.code, message: error.message)
            }
        }

        store.on(TodoActions.create, as: CreateTodo.self) { state, action, ctx in
            try reduce(ctx) { () throws(TodoRejection) in
                let todo = try state.create(title: action.title, seq: ctx.seq)
                return "created #\(todo.id) \"\(todo.title)\""
            }
        }
        store.on(TodoActions.edit, as: EditTodo.self) { state, action, ctx in
            try reduce(ctx) { () throws(TodoRejection) in
                try state.edit(id: action.id, title: action.title)
                return "renamed #\(action.id)"
            }
        }
        store.on(TodoActions.toggle, as: ToggleTodo.self) { state, action, ctx in
            try reduce(ctx) { () throws(TodoRejection) in
                let done = try state.toggle(id: action.id)
                return "#\(action.id) is \(done ? "done" : "open")"
            }
        }
        store.on(TodoActions.delete, as: DeleteTodo.self) { state, action, ctx in
            try reduce(ctx) { () throws(TodoRejection) in
                try state.delete(id: action.id)
                return "deleted #\(action.id)"
            }
        }
        store.on(TodoActions.clearDone) { state, ctx in
            log(ctx, "cleared \(state.clearDone()) done todo(s)")
        }
        // No catch-all handler: a todo/* type with no handler above (a typo) is rejected with
        // store/unhandled-action, naming the handled types.

        // fluxd going away is not the end: the SDK reconnects and the store resumes, and says so in the log
        // (fluxbus.client / fluxbus.store lines): nothing to add here.
        try await StoreProcess.run(store, connection: connection, peerName: "todo-store") {
            " with \(store.state.todos.count) todo(s)"
        }
    }
}
