/// FluxBus's release version: what `fluxd --version` and `fluxctl --version` print and what fluxd names itself in
/// `welcome.server` (`fluxd/<version>`). One place, so the executables, the protocol and the docs agree.
public enum FluxBusVersion {
    /// The version, `MAJOR.MINOR.PATCH` (0.4.0: SPEC §16, large states).
    public static let string = "0.4.0"
}
