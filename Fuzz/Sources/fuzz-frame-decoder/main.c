// libFuzzer entry point of the frame-decoder target (Sources/FuzzTargets/*.swift).
//
// Linked with -sanitize=fuzzer, libFuzzer's own main (libclang_rt.fuzzer, linked whole) runs the fuzzer and calls
// LLVMFuzzerTestOneInput for each input; this C target only forwards it to the callback Swift exports with
// @_cdecl. (A C main calling LLVMFuzzerRunDriver clashes with that main at link time; a Swift main is renamed by
// SwiftPM.)
#include <stddef.h>
#include <stdint.h>

int fluxbus_fuzz_frame_decoder(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fluxbus_fuzz_frame_decoder(data, size);
}
