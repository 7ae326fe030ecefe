#include "data/jsonl.h"

#include <gtest/gtest.h>

#include <string>

namespace lathe {
namespace {

std::string ok_text(JsonlFieldReader& r, std::string_view line) {
    auto t = r.extract(line);
    EXPECT_TRUE(t.ok()) << line << " -> " << t.status().to_string();
    return t.ok() ? std::string(*t) : std::string();
}

std::string error_of(JsonlFieldReader& r, std::string_view line) {
    auto t = r.extract(line);
    EXPECT_FALSE(t.ok()) << line << " was accepted as '" << (t.ok() ? *t : "") << "'";
    return t.ok() ? std::string() : t.status().message();
}

TEST(JsonlFieldReader, ExtractsUnescapedStrings) {
    JsonlFieldReader r("text");
    EXPECT_EQ(ok_text(r, R"({"text": "hello"})"), "hello");
    EXPECT_EQ(ok_text(r, R"(  {"id": 3, "text": "a\nb\t\"q\" \u00e9 \ud83d\ude00"}  )"),
              "a\nb\t\"q\" \xc3\xa9 \xf0\x9f\x98\x80");
    EXPECT_EQ(ok_text(r, "{\"text\": \"caf\xc3\xa9\"}\r"), "caf\xc3\xa9");
    EXPECT_EQ(ok_text(r, R"({"t\u0065xt": "escaped key"})"), "escaped key");
    EXPECT_EQ(
        ok_text(r, R"({"text": "first", "meta": {"a": [1, 2.5e-3, null, true]}, "text": "last"})"),
        "last");
    EXPECT_EQ(ok_text(r, R"({"text": ""})"), "");  // empty is the caller's decision
    JsonlFieldReader body("body");
    EXPECT_EQ(ok_text(body, R"({"text": 1, "body": "other field"})"), "other field");
}

TEST(JsonlFieldReader, InvalidJsonAnywhereInTheLineIsAnError) {
    JsonlFieldReader r("text");
    EXPECT_NE(error_of(r, "").find("empty line"), std::string::npos);
    EXPECT_NE(error_of(r, "   \r").find("empty line"), std::string::npos);
    for (const char* bad : {
             R"({"text": "a")",
             R"({"text": "a",})",
             R"({"text": "a", "x": tru})",
             R"({"text": "a", "x": nul})",
             R"({"text": "a", "x": 01})",
             R"({"text": "a", "x": 1.})",
             R"({"text": "a", "x": -})",
             R"({"text": "a", "x": [1, 2,]})",
             R"({"text": "a", "x": {"k" 1}})",
             R"({"text": "a"} {"text": "b"})",
             R"({"text": "a"} x)",
             R"({text: "a"})",
         }) {
        EXPECT_NE(error_of(r, bad).find("not valid JSON"), std::string::npos) << bad;
    }
}

TEST(JsonlFieldReader, StructuralErrorsSayWhatIsWrong) {
    JsonlFieldReader r("text");
    EXPECT_NE(error_of(r, R"(["text", "a"])")
                  .find("expected a JSON object with a \"text\" field, found an array"),
              std::string::npos);
    EXPECT_NE(error_of(r, R"("just a string")").find("found a string"), std::string::npos);
    EXPECT_NE(error_of(r, "null").find("found null"), std::string::npos);
    // Text that only begins like a JSON value is not JSON (not a null, not a number).
    EXPECT_NE(error_of(r, "not json").find("not valid JSON"), std::string::npos);
    EXPECT_NE(error_of(r, "12abc").find("not valid JSON"), std::string::npos);
    const std::string missing = error_of(r, R"({"content": "x", "id": 7})");
    EXPECT_NE(missing.find("no \"text\" field (the object has keys \"content\", \"id\")"),
              std::string::npos)
        << missing;
    EXPECT_NE(error_of(r, "{}").find("no keys"), std::string::npos);
    EXPECT_NE(error_of(r, R"({"text": 42})").find("field \"text\" is a number, expected a string"),
              std::string::npos);
    EXPECT_NE(error_of(r, R"({"text": null})").find("is null"), std::string::npos);
    EXPECT_NE(error_of(r, R"({"text": ["a", "b"]})").find("is an array"), std::string::npos);
    // The last duplicate decides, as in Python.
    EXPECT_NE(error_of(r, R"({"text": "a", "text": 1})").find("is a number"), std::string::npos);
}

TEST(JsonlFieldReader, InvalidUtf8AndBadEscapes) {
    JsonlFieldReader r("text");
    const std::string utf8 = error_of(r, "{\"text\": \"ab\xff\"}");
    EXPECT_NE(utf8.find("invalid UTF-8 at byte column 13 (byte 0xff)"), std::string::npos) << utf8;
    // Invalid UTF-8 in a field that is not used is still an error.
    EXPECT_NE(error_of(r, "{\"x\": \"\xed\xa0\x80\", \"text\": \"ok\"}").find("invalid UTF-8"),
              std::string::npos);
    EXPECT_NE(error_of(r, R"({"text": "lone \ud800 surrogate"})").find("unpaired"),
              std::string::npos);
    EXPECT_NE(error_of(r, R"({"text": "bad \q escape"})").find("invalid escape"),
              std::string::npos);
}

TEST(JsonlFieldReader, HasField) {
    JsonlFieldReader r("text");
    EXPECT_TRUE(r.has_field(R"({"messages": [{"role": "user", "content": "hi"}]})", "messages"));
    EXPECT_FALSE(r.has_field(R"({"text": "x"})", "messages"));
    EXPECT_FALSE(r.has_field("not json", "messages"));
}

}  // namespace
}  // namespace lathe
