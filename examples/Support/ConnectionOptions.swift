import ArgumentParser
import FluxClient

/// The option every example executable takes to find fluxd: `--socket PATH` (default: the SDK's
/// `defaultSocketPath()`). Include it with `@OptionGroup var connection: ConnectionOptions`.
public struct ConnectionOptions: ParsableArguments, Sendable {
    @Option(name: .long, help: ArgumentHelp("fluxd's socket (default: the SDK's defaultSocketPath()).", valueName: "path"))
    public var socket: String?

    public init() {}

    /// The socket to connect to: `--socket`, or the SDK's default.
    public var socketPath: String { socket ?? defaultSocketPath() }
}
