import ArgumentParser
import FluxClient
import FluxCore
import FluxJSONValue

/// `fluxctl reload`: asks fluxd to read its config file again (what `systemctl reload fluxd` and SIGHUP do).
struct Reload: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Reload fluxd's config file: start, stop or restart the workers it changed and apply the log level and format.",
        discussion: """
            All or nothing: fluxd refuses (exit 4, reload-refused) when it has no config file, the file is not valid, or \
            the file changes a setting that takes a restart (socket, data directory, limits, ...: the message names \
            them); then nothing changes. Allowed to fluxd's own user, root and the config's admins. See docs/configuration.md.
            """)
    @OptionGroup var options: GlobalOptions

    func run() async throws {
        let client = try await options.connect()
        defer { client.abort() }
        let result: ReloadResult
        do {
            result = try await client.reload(timeout: options.requestDuration)
        } catch {
            switch error {
            case .server(let e) where e.code == .reloadRefused || e.code == .forbidden:
                throw fail(Exit.refused, "reload refused: \(e.message)")
            default:
                throw failure(error, socket: options.socketPath)
            }
        }
        if options.json {
            let list: ([String]) -> JSONValue = { .array($0.map { .string($0) }) }
            emit(JSONValue.object([(key: "added", value: list(result.added)), (key: "removed", value: list(result.removed)),
                                   (key: "changed", value: list(result.changed)), (key: "settings", value: list(result.settings))]).compact)
            return
        }
        let none: ([String]) -> String = { $0.isEmpty ? "none" : $0.joined(separator: ", ") }
        emit("reloaded: workers added \(none(result.added)), removed \(none(result.removed)), restarted \(none(result.changed)); settings applied \(none(result.settings))")
    }
}
