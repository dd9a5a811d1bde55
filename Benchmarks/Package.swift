// swift-tools-version: 6.1
//
// In-process micro-benchmarks (ordo-one/benchmark) of what fluxd and the SDKs do per frame: envelope scanning,
// frame decoding and building, and the Foundation JSON an SDK store pays for its Codable state. A separate package
// so the main build and CI never resolve or build the benchmark dependencies.
//
//   cd Benchmarks && swift package --scratch-path .build-bench benchmark
//
// The broker-level figures (fluxd vs the floor and the peers) come from scripts/bench.sh, not from here.
import PackageDescription

// `.package(path: "..")` takes its identity from the checkout's directory name, whatever the clone is called.
let rootIdentity = String(Context.packageDirectory.split(separator: "/").dropLast().last ?? "main").lowercased()

let package = Package(
    name: "FluxBusBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: ".."),
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        .executableTarget(
            name: "CoreCosts",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "FluxClient", package: rootIdentity),
            ],
            path: "Benchmarks/CoreCosts",
            swiftSettings: [.swiftLanguageMode(.v6)],
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)
