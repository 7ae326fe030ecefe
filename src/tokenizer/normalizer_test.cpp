// Normalizers against Hugging Face `tokenizers`: every expected string below is what
// tokenizers 0.23.3 (Python) returns from `Tokenizer.normalizer.normalize_str(input)` for a
// tokenizer.json whose "normalizer" is the given JSON (generated once, pasted here).

#include "tokenizer/normalizer.h"

#include <gtest/gtest.h>

#include <string_view>

namespace lathe {
namespace {

using namespace std::literals;

struct NormalizerCase {
    std::string_view json;
    std::string_view input;
    std::string_view expected;
};

const NormalizerCase kCases[] = {
    {R"({"type":"NFC"})", "e\u0301 \u212b \ufb01 A\u030a"sv, "\u00e9 \u00c5 \ufb01 \u00c5"sv},
    {R"({"type":"NFD"})", "\u00e9 \u212b \ufb01"sv, "e\u0301 A\u030a \ufb01"sv},
    {R"({"type":"NFKC"})", "\ufb01 \u2460 \uff21 \u00bd e\u0301"sv, "fi 1 A 1\u20442 \u00e9"sv},
    {R"({"type":"NFKD"})", "\ufb01 \u00e9 \u2075"sv, "fi e\u0301 5"sv},
    {R"({"type":"Lowercase"})", "HeLLo \u0130stanbul \u00c0\u03a3\u0391 \u01c5"sv,
     "hello i\u0307stanbul \u00e0\u03c3\u03b1 \u01c6"sv},
    {R"({"type":"Strip","strip_left":true,"strip_right":false})", " \t\u3000 a b \u00a0 "sv,
     "a b \u00a0 "sv},
    {R"({"type":"Strip","strip_left":false,"strip_right":true})", " \t a b \u00a0\n"sv,
     " \t a b"sv},
    {R"({"type":"StripAccents"})", "e\u0301a\u0308\u0489x"sv, "eax"sv},
    {R"({"type":"Replace","pattern":{"String":"ab"},"content":"X"})", "abab a.b ab"sv,
     "XX a.b X"sv},
    {R"({"type":"Replace","pattern":{"Regex":"\\s+"},"content":"_"})", "a  b\t\tc \u00a0d"sv,
     "a_b_c_d"sv},
    {R"({"type":"Replace","pattern":{"String":"."},"content":""})", "a.b.c"sv, "abc"sv},
    // Capturing groups: the whole match is replaced; "$1" in the content is literal text.
    {R"j({"type":"Replace","pattern":{"Regex":"(\\d+)"},"content":"<$1>"})j",
     "it's 123 don't 45x'ta'sb 77  x"sv, "it's <$1> don't <$1>x'ta'sb <$1>  x"sv},
    {R"j({"type":"Replace","pattern":{"Regex":"('s|'t)|(x)"},"content":"_"})j",
     "it's 123 don't 45x'ta'sb 77  x"sv, "it_ 123 don_ 45__a_b 77  _"sv},
    {R"j({"type":"Replace","pattern":{"Regex":"(\\s)(\\s)?"},"content":"▁"})j",
     "it's 123 don't 45x'ta'sb 77  x"sv, "it's▁123▁don't▁45x'ta'sb▁77▁x"sv},
    {R"({"type":"Prepend","prepend":"▁"})", "hi there"sv, "\u2581hi there"sv},
    {R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]})",
     "hi there  you"sv, "\u2581hi\u2581there\u2581\u2581you"sv},
    {R"({"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true})",
     "H\u00e9llo\tW\u00f6rld\000\ufffd \u4e2d\u6587 \007x"sv, "hello world  \u4e2d  \u6587  x"sv},
    {R"({"type":"BertNormalizer","clean_text":false,"handle_chinese_chars":false,"strip_accents":false,"lowercase":false})",
     "H\u00e9llo \u4e2d"sv, "H\u00e9llo \u4e2d"sv},
    {R"({"type":"Nmt"})", "a\001b\tc\u200bd\ufeffe"sv, "ab c d e"sv},
    {R"({"type":"ByteLevel"})", "a b\n\u00e9"sv, "a\u0120b\u010a\u00c3\u00a9"sv},
    // HF normalizes with Unicode 9.0 data: marks and compositions added later stay as they are
    // (U+1DF6, U+07FD, U+1FBF5, U+32FF, U+1E030), and U+1CF2 was still a mark in 9.0.
    {R"({"type":"NFD"})", "a\u0345\u1df6\u0301 \u1e9b\u0323"sv,
     "a\u0345\u1df6\u0301 \u017f\u0323\u0307"sv},
    {R"({"type":"NFC"})", "a\u0323\u07fd\u0307 \u1100\u1161\u11a8 \u0b47\u0b3e"sv,
     "\u1ea1\u07fd\u0307 \uac01 \u0b4b"sv},
    {R"({"type":"NFKC"})", "\U0001fbf5 \u32ff \u3300 \U0001e030"sv,
     "\U0001fbf5 \u32ff \u30a2\u30d1\u30fc\u30c8 \U0001e030"sv},
    {R"({"type":"StripAccents"})", "e\u0301\u1df6x\u111c9\u1cf2y"sv, "e\u1df6x\u111c9y"sv},
};

TEST(Normalizer, MatchesHuggingFace) {
    for (const NormalizerCase& c : kCases) {
        Result<std::unique_ptr<Normalizer>> n = normalizer_from_json(c.json, "test.json");
        ASSERT_TRUE(n.ok()) << c.json << ": " << n.status().to_string();
        Result<std::string> text = (*n)->normalize_to_string(c.input);
        ASSERT_TRUE(text.ok()) << c.json << ": " << text.status().to_string();
        EXPECT_EQ(*text, c.expected) << c.json;
    }
}

TEST(Normalizer, ReportsWhetherTheTextStillStartsAtTheOriginal) {
    // Metaspace's prepend_scheme "first" relies on this (HF: the first normalized character's
    // alignment). Stripping leading spaces moves the start; lowercasing does not.
    auto strip =
        normalizer_from_json(R"({"type":"Strip","strip_left":true,"strip_right":true})", "t");
    ASSERT_TRUE(strip.ok());
    std::string out;
    EXPECT_FALSE(*(*strip)->normalize("  a", out));
    EXPECT_EQ(out, "a");
    out.clear();
    EXPECT_TRUE(*(*strip)->normalize("a  ", out));
    auto lower = normalizer_from_json(R"({"type":"Lowercase"})", "t");
    ASSERT_TRUE(lower.ok());
    out.clear();
    EXPECT_TRUE(*(*lower)->normalize("ABC", out));
}

// A Replace pattern that backtracks exponentially gives up on a short text: normalize returns
// an error, alone and inside a Sequence, and the next text normalizes as usual.
TEST(Normalizer, ReplacePatternThatGivesUpIsAnError) {
    const std::string replace =
        R"({"type":"Replace","pattern":{"Regex":"(a|aa)+$"},"content":"x"})";
    for (const std::string& json :
         {replace, R"({"type":"Sequence","normalizers":[{"type":"Lowercase"},)" + replace +
                       R"(,{"type":"NFC"}]})"}) {
        auto n = normalizer_from_json(json, "t");
        ASSERT_TRUE(n.ok()) << json << ": " << n.status().to_string();
        std::string out;
        Result<bool> r = (*n)->normalize(std::string(100, 'a') + "b", out);
        ASSERT_FALSE(r.ok()) << json;
        EXPECT_NE(r.status().message().find("'(a|aa)+$' gave up on this text of 101 bytes"),
                  std::string::npos)
            << r.status().message();
        EXPECT_NE(r.status().message().find("split or shorten the text"), std::string::npos)
            << r.status().message();
        EXPECT_FALSE((*n)->normalize_to_string(std::string(100, 'a') + "b").ok());
        Result<std::string> ok = (*n)->normalize_to_string("baa");
        ASSERT_TRUE(ok.ok()) << ok.status().to_string();
        EXPECT_EQ(*ok, "bx");
    }
}

TEST(Normalizer, ErrorsNameThePathAndSuggest) {
    auto r = normalizer_from_json(
        R"({"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Lowercaze"}]})", "tok.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("tok.json: normalizer.normalizers[1]"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("did you mean 'Lowercase'"), std::string::npos)
        << r.status().message();

    auto bad_regex = normalizer_from_json(
        R"({"type":"Replace","pattern":{"Regex":"(unclosed"},"content":""})", "tok.json");
    ASSERT_FALSE(bad_regex.ok());
    EXPECT_NE(bad_regex.status().message().find("normalizer.pattern.Regex"), std::string::npos)
        << bad_regex.status().message();

    auto precompiled =
        normalizer_from_json(R"({"type":"Precompiled","precompiled_charsmap":""})", "t");
    ASSERT_FALSE(precompiled.ok());
    EXPECT_EQ(precompiled.status().code(), StatusCode::kUnimplemented);

    auto missing = normalizer_from_json(R"({"type":"Prepend"})", "t");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("'prepend'"), std::string::npos);
}

}  // namespace
}  // namespace lathe
