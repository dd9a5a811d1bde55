import Testing
@testable import FluxCore

/// `jsonArrayElements`: the elements of a JSON array through the same validating scanner as every frame.
struct ArrayElementsTests {
    func texts(_ json: String) -> [String]? {
        jsonArrayElements(ArraySlice(Array(json.utf8)))?.map { String(decoding: $0.bytes, as: UTF8.self) }
    }

    @Test func elementsKeepTheirExactBytes() {
        #expect(texts(#"[{"a":1}, {"b":[1,{"c":"]"}]} ,"x\"]",2.5e3,null,true]"#)
            == [#"{"a":1}"#, #"{"b":[1,{"c":"]"}]}"#, #""x\"]""#, "2.5e3", "null", "true"])
        #expect(texts(" [ ] ") == [])
        #expect(jsonArrayElements(ArraySlice(Array(#"[{},[]]"#.utf8)))?.map(\.kind) == [.object, .array])
    }

    @Test func slicesOfALargerBufferAreReadInPlace() {
        let whole = Array(#"{"list":[1,{"k":2}]}"#.utf8)
        let slice = whole[8..<19]  // [1,{"k":2}]
        let elements = jsonArrayElements(slice)
        #expect(elements?.map { String(decoding: $0.bytes, as: UTF8.self) } == ["1", #"{"k":2}"#])
        #expect(elements?.last?.bytes.startIndex == 11)
    }

    @Test func invalidInputIsNil() {
        for bad in ["", "{}", "[1,]", "[1 2]", "[1", #"["\x"]"#, "[1] 2", "[01]", "[\u{1}]", #"[{"a":}]"#] {
            #expect(texts(bad) == nil, "\(bad)")
        }
        #expect(jsonArrayElements(ArraySlice(Array("[[[[1]]]]".utf8)), maxDepth: 3) == nil)
    }
}
