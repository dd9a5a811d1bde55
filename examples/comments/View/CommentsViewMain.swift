import ArgumentParser
import CommentsModel
import ExampleSupport
import FluxClient
import Foundation

/// `comments-view`: shows one site's comments (WordPressFlux's view model holding a query receipt, seed 001).
///
/// It subscribes to the `comments` store, declares `CommentsQuery {site}` and keeps the `QueryReceipt` while it
/// runs (the store fetches what the active queries need; when the view exits the receipt is released and the
/// query ends). Commands from stdin become actions dispatched with settlement.
@main
struct CommentsViewCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "comments-view",
        abstract: "The FluxBus comments example's view: one site's comments, kept loaded by a query.",
        discussion: """
            Commands (one per line): reply PARENT TEXT (PARENT 0 starts a new thread), delete ID, refresh, quit \
            (end of input quits too). On a terminal the screen is redrawn on every snapshot; otherwise every render \
            is printed after a line "--- version N ---". With --once-loaded it reads no commands: it exits 0 after \
            the first render where the site is loaded, 1 if its fetch failed.
            """
    )

    @Option(name: .long, help: "The site whose comments to show.")
    var site: Int

    @OptionGroup var connection: ConnectionOptions

    @Flag(name: .customLong("once-loaded"), help: "Exit 0 once the site is loaded (1 if its fetch fails).")
    var onceLoaded = false

    @Option(name: .long, help: ArgumentHelp("With --once-loaded: give up (exit 2) after this many seconds.", valueName: "s"))
    var timeout: Double?

    @Option(name: .long, help: "The comments store.")
    var store: String = CommentsStores.comments

    func run() async throws {
        ExampleLogging.bootstrap()
        let client = try await ViewProcess.connect(connection, name: "comments-view")
        let site = self.site
        let storeName = store
        let screen = CommentsScreen(site: site, tty: Console.stdoutIsTTY)
        let (outcomes, outcome) = AsyncStream.makeStream(of: Int32.self)

        // Subscribe first, then query: the snapshot that answers the query cannot be missed.
        let subscription = client.subscribe(store: storeName, as: CommentsState.self)
        let viewer = ViewProcess.follow(subscription, on: screen, { event in
            switch await screen.event(event) {
            case .pending: break
            case .loaded: outcome.yield(0)
            case .failed: outcome.yield(1)
            }
        }, finished: { outcome.finish() })
        let errorsTask = ViewProcess.showErrors(of: client, on: screen)
        let receipt: QueryReceipt
        do {
            receipt = try await client.query(store: storeName, CommentsQuery(site: site))
        } catch {
            Console.err("comments-view: cannot query \(storeName) for site \(site): \(error)\n")
            throw ExitCode.failure
        }

        var code: Int32 = 0
        if onceLoaded {
            if let timeout {
                Task {
                    try await Task.sleep(for: .milliseconds(Int(timeout * 1000)))
                    await screen.error("site \(site) not loaded after \(timeout) s")
                    outcome.yield(2)
                }
            }
            for await c in outcomes {
                code = c
                break
            }
        } else {
            await ViewProcess.readCommands(CommentsCommand.self) {
                await perform($0, site: site, client: client, screen: screen)
            }
        }

        receipt.cancel()
        viewer.cancel()
        errorsTask.cancel()
        await client.close()
        if code != 0 { throw ExitCode(code) }
    }

    /// Dispatches one command with settlement, reports refusals, waits until its snapshot is rendered.
    private func perform(_ command: CommentsCommand, site: Int, client: FluxClient, screen: CommentsScreen) async {
        let dispatch: () async throws -> Settlement
        switch command {
        case .usage(let text):
            await screen.error("usage: \(text)")
            return
        case .quit:
            return
        case .reply(let parent, let text):
            dispatch = {
                try await client.dispatchAndSettle(
                    type: CommentsActions.reply, payload: ReplyToComment(site: site, parent: parent, content: text))
            }
        case .delete(let id):
            dispatch = {
                try await client.dispatchAndSettle(type: CommentsActions.delete, payload: DeleteComment(site: site, id: id))
            }
        case .refresh:
            dispatch = { try await client.dispatchAndSettle(type: CommentsActions.fetchStarted, payload: SiteRef(site: site)) }
        }
        guard let settlement = await ViewProcess.settle(on: screen, dispatch),
              let version = settlement.doneVersion(store) else { return }
        await ViewProcess.waitUntil { await screen.hasRendered(version) }
    }
}

/// One line of user input.
enum CommentsCommand: ViewCommand {
    case reply(Int, String)
    case delete(Int)
    case refresh
    case quit
    case usage(String)

    /// Parses a line; nil for a blank one.
    init?(_ line: String) {
        let parts = line.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: true)
        guard let first = parts.first else { return nil }
        switch first.lowercased() {
        case "reply", "r":
            if parts.count > 1, let parent = Int(parts[1]) {
                self = .reply(parent, parts.count > 2 ? String(parts[2]) : "")
            } else {
                self = .usage("reply PARENT TEXT")
            }
        case "delete", "del", "d", "rm":
            if parts.count == 2, let id = Int(parts[1]) { self = .delete(id) } else { self = .usage("delete ID") }
        case "refresh":
            self = .refresh
        case "quit", "exit", "q":
            self = .quit
        default:
            self = .usage("unknown command \"\(first)\"; try reply PARENT TEXT, delete ID, refresh, quit")
        }
    }
}
