import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue

/// `fluxctl forget STORE...`: forgets stores that are down for good (SPEC §10).
struct Forget: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Forget stores that are down for good (a benchmark's, a worker's that was removed).",
        discussion: """
            Each store's queued actions settle store-unavailable, its subscribers get store-down (forgotten), and its \
            state, routes and registration go; a durable fluxd remembers that after a restart. A store registered \
            later under the name starts anew. A store that is up is refused (exit 5, store-is-up), a name with no \
            registered store too (unknown-store). Allowed to fluxd's own user, root and the config's admins \
            (forbidden, exit 5, for others). Prints one line per store: "forgot STORE (N queued actions given up)".
            """)
    @OptionGroup var options: GlobalOptions
    @Argument(help: "The stores to forget.") var stores: [String]

    func validate() throws {
        if stores.isEmpty { throw ValidationError("name at least one store to forget") }
        for store in stores where !Names.isValidStore(store) {
            throw ValidationError("\"\(store)\" is not a store name (1-128 bytes of A-Z a-z 0-9 . _ : / -)")
        }
    }

    func run() async throws {
        let client = try await options.connect()
        defer { client.abort() }
        var refused: [String] = []
        for store in stores {
            do {
                let gaveUp = try await client.forget(store: store, timeout: options.requestDuration)
                if options.json {
                    emit(JSONValue.object([(key: "store", value: .string(store)), (key: "gaveUp", value: .number("\(gaveUp)"))]).compact)
                } else {
                    emit("forgot \(store) (\(gaveUp) queued action\(gaveUp == 1 ? "" : "s") given up)")
                }
            } catch {
                switch error {
                case .server(let e) where e.code == .forbidden:
                    throw fail(Exit.refused, "forget refused: \(e.message)")
                case .server(let e) where e.code == .storeIsUp || e.code == .unknownStore:
                    printError("fluxctl: cannot forget \(store): \(e.message)")
                    refused.append(store)
                default:
                    throw failure(error, socket: options.socketPath)
                }
            }
        }
        if !refused.isEmpty { throw ExitCode(Exit.refused) }
    }
}
