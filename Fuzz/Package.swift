// swift-tools-version: 6.1
//
// Coverage-guided libFuzzer targets for FluxBus (docs/fuzzing.md; scripts/fuzz.sh builds and runs them).
//
// A package of its own, so that the root package's `swift build` never needs the fuzzer runtime. Build it with
//   swift build --package-path Fuzz --scratch-path .build-fuzz -c release -Xswiftc -sanitize=fuzzer,address
// The targets live in the Swift library FuzzTargets, which exports one callback per target with `@_cdecl`. Each
// executable is one small C file defining `LLVMFuzzerTestOneInput` as a call to its callback; `main` is
// libFuzzer's own (libclang_rt.fuzzer, which -sanitize=fuzzer links whole: a C `main` calling
// `LLVMFuzzerRunDriver` clashes with it, and SwiftPM renames a Swift executable's `main`).
import Foundation
import PackageDescription

// A path dependency's identity is its directory's name (whatever the checkout is called).
let root = URL(fileURLWithPath: Context.packageDirectory).deletingLastPathComponent().standardizedFileURL
let rootIdentity = root.lastPathComponent.lowercased()

let swiftSettings: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "FluxBusFuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: ".."),
    ],
    targets: [
        .target(
            name: "FuzzTargets",
            dependencies: [
                .product(name: "FluxCore", package: rootIdentity),
                .product(name: "FluxRouter", package: rootIdentity),
                .product(name: "FluxJSONValue", package: rootIdentity),
                .product(name: "FluxJournal", package: rootIdentity),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(name: "fuzz-frame-decoder", dependencies: ["FuzzTargets"]),
        .executableTarget(name: "fuzz-envelope", dependencies: ["FuzzTargets"]),
        .executableTarget(name: "fuzz-router", dependencies: ["FuzzTargets"]),
    ]
)
