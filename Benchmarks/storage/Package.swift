// swift-tools-version: 6.1
//
// The measurement behind issue 15's storage choice (docs/journal.md): an append-only log of fluxd's own, written
// with group commit (one fdatasync per batch), against SQLite in WAL mode through GRDB, on the same disk, the same
// records and the same batch sizes. A package of its own: the root build never needs GRDB for this.
//
//   swift run -c release --package-path Benchmarks/storage storage-bench [--dir DIR] [--records N]
import PackageDescription

let package = Package(
    name: "StorageBench",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.0.0"),
    ],
    targets: [
        .executableTarget(
            name: "storage-bench",
            dependencies: [.product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
