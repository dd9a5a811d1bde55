// swift-tools-version: 6.1
//
// FluxBus: Flux (actions -> dispatcher -> stores -> views) across processes on one Linux machine.
//
// Dependencies point one way:
//   FluxCore (wire types, framing, JSON envelope scanner; no I/O)
//     <- FluxJSONValue (order-keeping JSON values, RFC 6901 pointers, RFC 6902 patches, diffs; TrackedArray and the
//        codecs over JSON values that SPEC §16's patches are made and read with; also used by FluxClient,
//        FluxStore, TodoModel and fluxctl)
//     <- FluxJournal (the durable journal: segments, checkpoints, reads; files, no sockets)
//     <- FluxRouter (the dispatcher as a pure state machine; the semantics live here; applies patches, §16)
//     <- FluxTransport (thin libuv layer: loop, Unix-socket listener, connections, timers, signals)
//     <- FluxDaemon (feeds transport events into the router, carries out its effects)
//     <- fluxd (executable: argument parsing and wiring only)
//   FluxCore <- FluxClient (client SDK, Foundation JSON for user types) <- FluxStore (store SDK)
//   FluxRouter + FluxClient <- FluxTesting (in-memory bus for unit-testing stores without sockets)
//   FluxClient + FluxJSONValue <- fluxctl (debug CLI)
//
// The trait `Tools` (on by default) brings the dependencies only fluxd, fluxctl and the examples use: a project that
// uses the libraries depends on this package with `traits: []` and resolves swift-log and swift-collections only
// (README, scripts/check-sdk-package.sh).
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v6),
]

// FLUXBUS_NO_JEMALLOC=1 builds fluxd on the system malloc: AddressSanitizer (scripts/asan.sh) replaces malloc
// itself and aborts at startup when jemalloc is linked too. Without it, fluxd links jemalloc (see CJemalloc).
let useJemalloc = Context.environment["FLUXBUS_NO_JEMALLOC"].map { $0.isEmpty || $0 == "0" } ?? true

let package = Package(
    name: "FluxBus",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "fluxd", targets: ["fluxd"]),
        .executable(name: "fluxctl", targets: ["fluxctl"]),
        .library(name: "FluxClient", targets: ["FluxClient"]),
        .library(name: "FluxStore", targets: ["FluxStore"]),
        .library(name: "FluxTesting", targets: ["FluxTesting"]),
        .library(name: "FluxJSONValue", targets: ["FluxJSONValue"]),
        .library(name: "FluxLog", targets: ["FluxLog"]),
        // For the fuzz targets (Fuzz/Package.swift depends on this package by path).
        .library(name: "FluxCore", targets: ["FluxCore"]),
        .library(name: "FluxRouter", targets: ["FluxRouter"]),
        .library(name: "FluxJournal", targets: ["FluxJournal"]),
    ],
    traits: [
        .trait(name: "Tools", description: "fluxd, fluxctl and the examples: their dependencies (TOMLKit, swift-argument-parser, hdrhistogram-swift, swift-prometheus) are only resolved with it. On by default; a project that uses only the libraries turns it off with `traits: []` on its .package line."),
        .default(enabledTraits: ["Tools"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift", from: "0.1.0"),
        .package(url: "https://github.com/LebJe/TOMLKit", from: "0.6.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.1.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CLibUV",
            pkgConfig: "libuv",
            providers: [.apt(["libuv1-dev"])]
        ),
        // fluxd's allocator (the one Redis uses): on fluxd's hot path, where frames are allocated in batches of
        // a pipelined read and freed later, glibc's malloc left its per-thread cache and cost ~1k instructions per
        // routed action more (Benchmarks/PROFILE.md). Linked by the fluxd executable only.
        .systemLibrary(
            name: "CJemalloc",
            pkgConfig: "jemalloc",
            providers: [.apt(["libjemalloc-dev"])]
        ),
        .target(name: "FluxCore", swiftSettings: swiftSettings),
        .target(
            name: "FluxRouter",
            dependencies: ["FluxCore", "FluxJournal", "FluxJSONValue", .product(name: "DequeModule", package: "swift-collections")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "FluxTransport",
            dependencies: ["CLibUV", "FluxCore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .target(
            name: "FluxDaemon",
            dependencies: ["CFluxSys", "FluxCore", "FluxLog", "FluxRouter", "FluxJournal", "FluxTransport", .product(name: "Logging", package: "swift-log"),
                           .product(name: "TOMLKit", package: "TOMLKit", condition: .when(traits: ["Tools"])),
                           .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["Tools"]))],
            swiftSettings: swiftSettings
        ),
        // fluxd's journal (SPEC §15, docs/journal.md): the record format and recovered state (pure), and the
        // segment files of a data directory behind the `AppendFile` storage seam.
        .target(name: "CFluxSys"),
        .target(name: "FluxJournal", dependencies: ["CFluxSys", "FluxCore", "FluxJSONValue", .product(name: "DequeModule", package: "swift-collections")],
                swiftSettings: swiftSettings),
        // One log line format for fluxd and every process using the SDKs (docs/logging.md).
        .target(name: "FluxLog", dependencies: ["FluxCore", .product(name: "Logging", package: "swift-log")],
                swiftSettings: swiftSettings),
        .target(name: "FluxClient", dependencies: ["FluxCore", "FluxJSONValue", .product(name: "Logging", package: "swift-log")],
                swiftSettings: swiftSettings),
        .target(name: "FluxStore", dependencies: ["FluxCore", "FluxClient", "FluxJSONValue",
                                                  .product(name: "Logging", package: "swift-log")],
                swiftSettings: swiftSettings),
        .target(name: "FluxJSONValue", dependencies: ["FluxCore", .product(name: "HashTreeCollections", package: "swift-collections")],
                swiftSettings: swiftSettings),
        .target(name: "FluxTesting", dependencies: ["FluxCore", "FluxJournal", "FluxRouter", "FluxClient", "FluxStore"], swiftSettings: swiftSettings),
        .executableTarget(
            name: "fluxd",
            dependencies: (useJemalloc ? ["CJemalloc"] : []) + [
                "FluxDaemon",
                "FluxLog",
                "FluxRouter",
                "FluxJournal",
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"])),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings + (useJemalloc ? [.define("FLUXBUS_JEMALLOC")] : [])
        ),
        // How fluxd starts supervised workers so that they die with it (PR_SET_PDEATHSIG, then exec).
        .executableTarget(name: "fluxd-exec"),
        // The benchmark's Swift SDK store (scripts/bench.sh, workload 7): not a product.
        .executableTarget(
            name: "flux-bench-store",
            dependencies: ["FluxStore", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))],
            swiftSettings: swiftSettings
        ),
        // The Swift SDK's own cost with a large state, before/after SPEC §16 (A/B in one process; issue 16).
        .executableTarget(
            name: "flux-delta-bench",
            dependencies: ["FluxClient", "FluxCore", "FluxJSONValue", "TodoModel"],
            swiftSettings: swiftSettings
        ),
        // The Swift side of the three-language JSON Patch differential test (scripts/patch-differential.py). Not a product.
        .executableTarget(name: "flux-patch-check", dependencies: ["FluxJSONValue"], swiftSettings: swiftSettings),
        // Benchmark workload 8 (issue 16): the example todo store and typed subscribers with a large state, whole
        // states vs deltas, one role per process (Benchmarks/run.py). Not a product.
        .executableTarget(
            name: "flux-large-state-bench",
            dependencies: ["FluxStore", "FluxClient", "FluxJSONValue", "TodoModel"],
            swiftSettings: swiftSettings
        ),
        .executableTarget(
            name: "fluxctl",
            dependencies: [
                "FluxClient",
                "FluxJSONValue",
                .product(name: "Histogram", package: "hdrhistogram-swift", condition: .when(traits: ["Tools"])),
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"])),
            ],
            swiftSettings: swiftSettings
        ),
        // Examples: each store and view is its own process (see examples/README.md).
        .target(name: "ExampleSupport", dependencies: ["FluxClient", "FluxStore", "FluxLog", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))], path: "examples/Support", swiftSettings: swiftSettings),
        .target(name: "TodoModel", dependencies: ["FluxJSONValue"], path: "examples/todo/Model", swiftSettings: swiftSettings),
        .executableTarget(name: "todo-store", dependencies: ["TodoModel", "ExampleSupport", "FluxStore", "FluxClient", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))], path: "examples/todo/Store", swiftSettings: swiftSettings),
        .executableTarget(name: "stats-store", dependencies: ["TodoModel", "ExampleSupport", "FluxStore", "FluxClient", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))], path: "examples/todo/Stats", swiftSettings: swiftSettings),
        .executableTarget(name: "todo-view", dependencies: ["TodoModel", "ExampleSupport", "FluxClient", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))], path: "examples/todo/View", swiftSettings: swiftSettings),
        .target(name: "CommentsModel", path: "examples/comments/Model", swiftSettings: swiftSettings),
        .executableTarget(name: "comments-store", dependencies: ["CommentsModel", "ExampleSupport", "FluxStore", "FluxClient", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))], path: "examples/comments/Store", swiftSettings: swiftSettings),
        .executableTarget(name: "comments-view", dependencies: ["CommentsModel", "ExampleSupport", "FluxClient", .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"]))], path: "examples/comments/View", swiftSettings: swiftSettings),
        // README.md's Swift snippets, compiled as written (FluxctlTests checks the README holds exactly these files).
        .executableTarget(name: "readme-counter-store", dependencies: ["FluxStore"], path: "examples/readme/Store", swiftSettings: swiftSettings),
        .executableTarget(name: "readme-counter-view", dependencies: ["FluxClient"], path: "examples/readme/View", swiftSettings: swiftSettings),
        .testTarget(name: "FluxCoreTests", dependencies: ["FluxCore"], swiftSettings: swiftSettings),
        .testTarget(name: "FluxRouterTests", dependencies: ["FluxCore", "FluxRouter", "FluxJournal"], swiftSettings: swiftSettings),
        .testTarget(
            name: "FluxTransportTests",
            dependencies: ["FluxTransport", "FluxCore", "CLibUV", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "FluxDaemonTests",
            dependencies: ["FluxDaemon", "FluxLog", "FluxRouter", "FluxTransport", "FluxCore", .product(name: "Logging", package: "swift-log"),
                           .product(name: "Prometheus", package: "swift-prometheus", condition: .when(traits: ["Tools"]))],
            swiftSettings: swiftSettings
        ),
        .testTarget(name: "FluxJournalTests", dependencies: ["FluxJournal"], swiftSettings: swiftSettings),
        .testTarget(name: "FluxJSONValueTests", dependencies: ["FluxJSONValue", "CFluxSys"], swiftSettings: swiftSettings),
        .testTarget(name: "FluxSDKTests", dependencies: ["FluxClient", "FluxStore", "FluxTesting", .product(name: "Logging", package: "swift-log")], swiftSettings: swiftSettings),
        .testTarget(name: "IntegrationTests", dependencies: ["FluxClient", "FluxCore", "FluxJournal"], swiftSettings: swiftSettings),
        // fluxctl's pure functions (the views of `top` and `bench`), tested without a bus.
        .testTarget(name: "FluxctlUnitTests", dependencies: ["fluxctl"], swiftSettings: swiftSettings),
    ]
)
