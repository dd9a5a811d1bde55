// flux-patch-check: applies JSON Patches the way the Swift library (`JSONValue.apply`) and fluxd (`JSONTree.apply`)
// do, for the three-language differential test (scripts/patch-differential.py; SPEC §16.1). Not a product.
//
// Reads JSON lines `{"doc": <JSON>, "patch": <JSON array>}` on stdin and writes one line per input:
// `{"ok":true,"doc":<result>}`, `{"ok":false,"error":"<text>"}`, or, when the library's and fluxd's code disagree,
// `{"ok":false,"error":"internal disagreement: ..."}`.
import FluxJSONValue

func reply(_ value: JSONValue) { print(value.compact) }
func failure(_ text: String) { reply(.object([("ok", .bool(false)), ("error", .string(text))])) }

while let line = readLine(strippingNewline: true) {
    if line.isEmpty { continue }
    guard let input = try? JSONValue(parsing: line), let doc = input["doc"], let patchValue = input["patch"] else {
        failure("unreadable input line")
        continue
    }
    let patch: JSONPatch
    do { patch = try JSONPatch(patchValue) } catch { failure("\(error.kind.rawValue): \(error)"); continue }
    var library = doc
    var libraryError: JSONPatchError?
    do { _ = try library.apply(patch) } catch { libraryError = error }
    var tree = JSONTree(doc)
    var treeError: JSONPatchError?
    do { _ = try tree.apply(patch) } catch { treeError = error }
    switch (libraryError, treeError) {
    case (nil, nil):
        let fromTree = tree.jsonValue
        if fromTree.jsonEquals(library) && fromTree.compact == library.compact {
            reply(.object([("ok", .bool(true)), ("doc", library)]))
        } else {
            failure("internal disagreement: JSONValue gave \(library.compact), JSONTree gave \(fromTree.compact)")
        }
    case (let a?, let b?):
        if a.kind == b.kind { failure("\(a.kind.rawValue): \(a)") } else {
            failure("internal disagreement: JSONValue failed \(a.kind.rawValue) (\(a)), JSONTree failed \(b.kind.rawValue) (\(b))")
        }
    case (let a?, nil):
        failure("internal disagreement: JSONValue failed (\(a)), JSONTree applied it: \(tree.jsonValue.compact)")
    case (nil, let b?):
        failure("internal disagreement: JSONTree failed (\(b)), JSONValue applied it: \(library.compact)")
    }
}
