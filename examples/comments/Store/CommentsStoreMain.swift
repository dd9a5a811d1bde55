import ArgumentParser
import CommentsModel
import ExampleSupport
import FluxClient
import FluxStore
import Foundation
import Synchronization

/// `comments-store`: the process owning the `comments` store, WordPressFlux's QueryStore over the bus (seed 001).
///
/// Views declare `CommentsQuery {site}` queries; fluxd tells the store the active set (`onQueriesChanged`). The
/// store records it in `activeSites` and starts a fetch of every newly active site it has neither loaded nor is
/// fetching: it marks the site `fetching` and spawns async work that announces `comments/fetch-started`, waits for
/// the simulated remote API, then dispatches `comments/loaded` or `comments/failed` with `cause` = the
/// `fetch-started` seq. Those actions come back to the store like any other and complete the state.
@main
struct CommentsStoreCommand: AsyncParsableCommand {
    static let configuration = StoreProcess.configuration(
        commandName: "comments-store",
        abstract: "The FluxBus comments example's query-driven store (store `comments`).",
        logs: "one line per action and per query change"
    )

    @OptionGroup var connection: ConnectionOptions

    @Option(name: .long, help: "The store name to register.")
    var name: String = CommentsStores.comments

    @Option(name: .customLong("latency-ms"), help: ArgumentHelp("Simulated latency of the remote API.", valueName: "ms"))
    var latencyMs: Int = 150

    @Option(name: .customLong("fail-sites"), help: ArgumentHelp("Sites whose fetch always fails, e.g. 3,5.", valueName: "list"))
    var failSites: String = ""

    @Option(name: .customLong("fail-rate"), help: ArgumentHelp("Probability that any other fetch fails.", valueName: "0...1"))
    var failRate: Double = 0.0

    @Option(name: .long, help: "Seed of the random failures (same seed, same failures).")
    var seed: UInt64 = 1

    func validate() throws {
        guard latencyMs >= 0 else { throw ValidationError("--latency-ms must not be negative") }
        guard (0.0...1.0).contains(failRate) else { throw ValidationError("--fail-rate must be between 0 and 1") }
        guard parsedFailSites != nil else { throw ValidationError("--fail-sites must be a comma-separated list of site ids") }
    }

    private var parsedFailSites: Set<Int>? {
        var sites = Set<Int>()
        for part in failSites.split(separator: ",") {
            guard let site = Int(part.trimmingCharacters(in: .whitespaces)) else { return nil }
            sites.insert(site)
        }
        return sites
    }

    func run() async throws {
        ExampleLogging.bootstrap()
        let name = self.name
        let api = SimulatedAPI(latency: .milliseconds(latencyMs), failSites: parsedFailSites ?? [], failRate: failRate,
                               seed: seed)
        let inFlight = InFlight()
        let store = FluxStore<CommentsState>(name: name, initial: CommentsState(), handles: [CommentsActions.all])
        let log = StoreLog(name)
        let logAction: @Sendable (ActionContext, String) -> Void = { ctx, what in
            let cause = ctx.cause.map { ", cause \($0)" } ?? ""
            log("seq \(ctx.seq) \(ctx.type) from peer \(ctx.origin)\(cause): \(what)")
        }

        // A fetch: announce it (its seq becomes the cause of the result), wait for the fake API, report back.
        let fetch: @Sendable (Int, Bool, Bool, StoreDispatcher) async throws -> Void = { site, announce, fails, out in
            var cause = out.cause
            if announce {
                cause = try await out.dispatchAndSettle(CommentsActions.fetchStarted, payload: SiteRef(site: site)).seq
            }
            let result = try await api.fetch(site: site, fails: fails)
            switch result {
            case .success(let comments):
                try out.client.dispatch(type: CommentsActions.loaded,
                                        payload: CommentsLoaded(site: site, comments: comments), cause: cause)
            case .failure(let error):
                try out.client.dispatch(type: CommentsActions.failed,
                                        payload: CommentsFailed(site: site, error: error.message), cause: cause)
            }
        }

        store.onQueriesChanged(as: CommentsQuery.self) { state, active, ctx in
            let newlyActive = state.setActive(sites: active.map(\.query.site))
            let counts = active.map { "\($0.query.site)×\($0.count)" }.joined(separator: ", ")
            log("queries changed: active sites \(state.activeSites) [\(counts)]")
            for site in state.activeSites where state.comments(site: site) == nil && !inFlight.contains(site) {
                // Newly active, or marked fetching by an earlier process of this store whose fetch died with it.
                guard newlyActive.contains(site) || state.isFetching(site: site) else { continue }
                state.startFetching(site: site)
                inFlight.insert(site)
                let fails = api.decideFailure(site: site)
                log("fetching site \(site)")
                ctx.spawn { out in try await fetch(site, true, fails, out) }
            }
            // A `fetching` flag left by an earlier process for a site nobody wants any more.
            for (key, running) in state.fetching where running {
                if let site = Int(key), !inFlight.contains(site), !state.activeSites.contains(site) {
                    state.fetching[key] = false
                }
            }
        }

        store.on(CommentsActions.fetchStarted, as: SiteRef.self) { state, ref, ctx in
            if inFlight.contains(ref.site) {
                logAction(ctx, "site \(ref.site) is being fetched")
                state.startFetching(site: ref.site)
                return
            }
            // A refresh asked by a client: fetch again (the result's cause is this action).
            state.startFetching(site: ref.site)
            inFlight.insert(ref.site)
            let fails = api.decideFailure(site: ref.site)
            logAction(ctx, "refreshing site \(ref.site)")
            ctx.spawn { out in try await fetch(ref.site, false, fails, out) }
        }
        store.on(CommentsActions.loaded, as: CommentsLoaded.self) { state, loaded, ctx in
            inFlight.remove(loaded.site)
            state.loaded(site: loaded.site, comments: loaded.comments)
            logAction(ctx, "site \(loaded.site) loaded, \(loaded.comments.count) comment(s)")
        }
        store.on(CommentsActions.failed, as: CommentsFailed.self) { state, failed, ctx in
            inFlight.remove(failed.site)
            state.failed(site: failed.site, error: failed.error)
            logAction(ctx, "site \(failed.site) failed: \(failed.error)")
        }
        store.on(CommentsActions.reply, as: ReplyToComment.self) { state, reply, ctx in
            do throws(CommentsRejection) {
                let comment = try state.reply(site: reply.site, parent: reply.parent, content: reply.content)
                logAction(ctx, "site \(reply.site): comment \(comment.id) answers \(reply.parent)")
            } catch {
                logAction(ctx, "rejected \(error)")
                throw StoreRejection(code: error.code, message: error.message)
            }
        }
        store.on(CommentsActions.delete, as: DeleteComment.self) { state, delete, ctx in
            do throws(CommentsRejection) {
                try state.delete(site: delete.site, id: delete.id)
                logAction(ctx, "site \(delete.site): comment \(delete.id) deleted")
            } catch {
                logAction(ctx, "rejected \(error)")
                throw StoreRejection(code: error.code, message: error.message)
            }
        }
        // No catch-all handler: an unknown comments/* type is rejected with store/unhandled-action.
        try await StoreProcess.run(store, connection: connection, peerName: "comments-store") {
            " (latency \(latencyMs) ms, failing sites \(failSites.isEmpty ? "none" : failSites), fail rate \(failRate), seed \(seed))"
        }
    }
}

/// The sites whose fetch this process is running (process-local: the state's `fetching` flag may outlive a
/// crashed store process, this set does not).
final class InFlight: Sendable {
    private let sites = Mutex(Set<Int>())

    func contains(_ site: Int) -> Bool { sites.withLock { $0.contains(site) } }
    func insert(_ site: Int) { _ = sites.withLock { $0.insert(site) } }
    func remove(_ site: Int) { _ = sites.withLock { $0.remove(site) } }
}

/// The failure of a simulated fetch.
struct FetchError: Error {
    var message: String
}

/// The remote API the store pretends to call: fixed latency, deterministic data, configured failures.
final class SimulatedAPI: Sendable {
    let latency: Duration
    let failSites: Set<Int>
    let failRate: Double
    private let random: Mutex<SeededGenerator>

    init(latency: Duration, failSites: Set<Int>, failRate: Double, seed: UInt64) {
        self.latency = latency
        self.failSites = failSites
        self.failRate = failRate
        self.random = Mutex(SeededGenerator(seed: seed))
    }

    /// Whether the next fetch of `site` fails. Decided when the fetch starts, in handler order, so a given seed
    /// gives the same failures for the same sequence of fetches.
    func decideFailure(site: Int) -> Bool {
        if failSites.contains(site) { return true }
        guard failRate > 0 else { return false }
        let roll = random.withLock { Double.random(in: 0..<1, using: &$0) }
        return roll < failRate
    }

    /// "Calls" the API.
    func fetch(site: Int, fails: Bool) async throws -> Result<[Comment], FetchError> {
        try await Task.sleep(for: latency)
        if fails {
            let why = failSites.contains(site) ? "site \(site) is configured to fail" : "random failure"
            return .failure(FetchError(message: "could not fetch the comments of site \(site): \(why)"))
        }
        return .success(FakeCommentsAPI.comments(site: site))
    }
}
