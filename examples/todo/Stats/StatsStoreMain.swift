import ArgumentParser
import ExampleSupport
import FluxClient
import FluxStore
import Foundation
import TodoModel

/// `stats-store`: the process owning the `stats` store, a store derived from another one (Flux's `waitFor`).
///
/// It handles the same `todo/*` actions as `todos` but declares `waitFor: ["todos"]` and follows the `todos`
/// store on its own connection. fluxd therefore hands it each action only after `todos` answered it, and sends
/// the `todos` snapshot that action produced first (protocol rule R3): the handler reads it with `ctx.latest` and
/// recomputes the counts, recording which `todos` version they come from. The `todos` changes arrive as patches
/// (SPEC §16.3) and `follow` decodes only the todos a change touched (`TodoState.todos` is a `TrackedArray`), so
/// an action costs this store a count over the todos, not a decode of the whole state (README's large-state step).
@main
struct StatsStoreCommand: AsyncParsableCommand {
    static let configuration = StoreProcess.configuration(
        commandName: "stats-store",
        abstract: "The FluxBus todo example's derived store: counts the todos (store `stats`, waitFor `todos`)."
    )

    @OptionGroup var connection: ConnectionOptions

    @Option(name: .long, help: "The store name to register.")
    var name: String = TodoStores.stats

    @Option(name: .long, help: "The todos store to count (and wait for).")
    var todos: String = TodoStores.todos

    func run() async throws {
        ExampleLogging.bootstrap()
        let name = self.name
        let todosStore = self.todos
        let log = StoreLog(name)
        let store = FluxStore<StatsState>(
            name: name, initial: StatsState(), handles: [TodoActions.all], waitFor: [todosStore])

        // Snapshots of `todos` that no action of ours will follow (its initial state, a state published outside
        // an action, or the state it had before this store existed) are counted at once. A snapshot produced by an
        // action we also handle is left to that action's handler, so one action makes one stats version.
        store.follow(todosStore, as: TodoState.self) { state, snapshot, _ in
            guard snapshot.seq <= state.lastSeq || state.todosVersionSeen == 0 else { return }
            state = StatsState(counting: snapshot.state, version: snapshot.version, lastSeq: state.lastSeq)
            log("synced with \(todosStore) v\(snapshot.version): \(state.total) total")
        }

        store.on(TodoActions.all) { state, ctx in
            guard let todos = ctx.latest(todosStore, as: TodoState.self) else {
                state.lastSeq = ctx.seq
                log("seq \(ctx.seq) \(ctx.type): no \(todosStore) snapshot yet")
                return
            }
            state = StatsState(counting: todos.state, version: todos.version, lastSeq: ctx.seq)
            log("""
                seq \(ctx.seq) \(ctx.type): \(state.total) total, \(state.done) done, \(state.open) open \
                (from \(todosStore) v\(todos.version), made at seq \(todos.seq))
                """)
        }
        try await StoreProcess.run(store, connection: connection, peerName: "stats-store") {
            ", waiting for \(todosStore)"
        }
    }
}
