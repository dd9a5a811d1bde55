import ArgumentParser

/// `fluxctl completions SHELL`: the shell completion script for bash, zsh or fish, generated from fluxctl's own
/// command definitions (swift-argument-parser's), so it always knows every subcommand and option of this build.
struct Completions: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the shell completion script for bash, zsh or fish.",
        discussion: """
            Install it where your shell looks (docs/fluxctl.md, "Shell completions"):
              bash: fluxctl completions bash > ~/.local/share/bash-completion/completions/fluxctl
              zsh:  fluxctl completions zsh > "${fpath[1]}/_fluxctl"
              fish: fluxctl completions fish > ~/.config/fish/completions/fluxctl.fish
            """)

    /// The shells swift-argument-parser writes completion scripts for.
    enum Shell: String, ExpressibleByArgument, CaseIterable {
        case bash, zsh, fish

        var completionShell: CompletionShell {
            switch self {
            case .bash: .bash
            case .zsh: .zsh
            case .fish: .fish
            }
        }
    }

    @Argument(help: "bash, zsh or fish.") var shell: Shell

    func run() {
        print(FluxCtl.completionScript(for: shell.completionShell), terminator: "")
    }
}
