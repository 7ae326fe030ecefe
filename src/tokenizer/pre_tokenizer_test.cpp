// Pre-tokenizers against Hugging Face `tokenizers`: every expected split below is what
// tokenizers 0.23.3 (Python) returns from `Tokenizer.pre_tokenizer.pre_tokenize_str(input)` for a
// tokenizer.json whose "pre_tokenizer" is the given JSON (generated once, pasted here).

#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include "tokenizer/regex.h"

namespace lathe {
namespace {

struct PreTokenizerCase {
    std::string_view json;
    std::string_view input;
    std::vector<std::string> expected;
};

const PreTokenizerCase kCases[] = {
    {R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true})",
     "Hello  world's 123!!\n",
     {"\u0120Hello", "\u0120", "\u0120world", "'s", "\u0120123", "!!", "\u010a"}},
    {R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false})",
     "a b\u00e9",
     {"a\u0120b\u00c3\u00a9"}},
    {R"({"type":"Split","pattern":{"String":"-"},"behavior":"Removed","invert":false})",
     "a-b--c-",
     {"a", "b", "c"}},
    {R"({"type":"Split","pattern":{"String":"-"},"behavior":"Isolated","invert":false})",
     "a-b--c-",
     {"a", "-", "b", "-", "-", "c", "-"}},
    {R"({"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithPrevious","invert":false})",
     "a-b--c-",
     {"a-", "b-", "-", "c-"}},
    {R"({"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithNext","invert":false})",
     "-a-b--c",
     {"-a", "-b", "-", "-c"}},
    {R"({"type":"Split","pattern":{"String":"-"},"behavior":"Contiguous","invert":false})",
     "a-b--c-",
     {"a", "-", "b", "--", "c", "-"}},
    {R"({"type":"Split","pattern":{"Regex":"\\d+"},"behavior":"Removed","invert":true})",
     "ab12cd345",
     {"12", "345"}},
    {R"({"type":"Split","pattern":{"Regex":"\\d+"},"behavior":"MergedWithNext","invert":true})",
     "ab12cd345",
     {"ab12", "cd345"}},
    {R"({"type":"Split","pattern":{"Regex":"x*"},"behavior":"MergedWithPrevious","invert":false})",
     "abxxc",
     {"a", "bxx", "c"}},
    {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})",
     "Hey  friend \u2581x",
     {"\u2581Hey", "\u2581", "\u2581friend", "\u2581", "\u2581x"}},
    {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":true})",
     "Hey  friend",
     {"Hey", "\u2581", "\u2581friend"}},
    {R"({"type":"Metaspace","replacement":"_","prepend_scheme":"always","split":false})",
     "Hey friend",
     {"_Hey_friend"}},
    {R"({"type":"Metaspace","replacement":"▁","add_prefix_space":true})",
     "a b",
     {"\u2581a", "\u2581b"}},
    {R"({"type":"Digits","individual_digits":true})",
     "a123b\u0663\u00b2",
     {"a", "1", "2", "3", "b", "\u0663", "\u00b2"}},
    {R"({"type":"Digits","individual_digits":false})",
     "a123b45\u0663c",
     {"a", "123", "b", "45\u0663", "c"}},
    {R"({"type":"Whitespace"})",
     "Hello, world!  It's 42\u00b2 _x_ na\u00efve \u0915\u094d\u0937",
     {"Hello", ",", "world", "!", "It", "'", "s", "42", "\u00b2", "_x_", "na\u00efve",
      "\u0915\u094d\u0937"}},
    {R"({"type":"WhitespaceSplit"})", " a\tb\u00a0c\u3000d ", {"a", "b", "c", "d"}},
    {R"({"type":"Punctuation","behavior":"Isolated"})",
     "Hey, you... $5+3\u00bfok?",
     {"Hey", ",", " you", ".", ".", ".", " ", "$", "5", "+", "3", "\u00bf", "ok", "?"}},
    {R"({"type":"Punctuation","behavior":"MergedWithPrevious"})",
     "Hey, you... ok?",
     {"Hey,", " you.", ".", ".", " ok?"}},
    {R"({"type":"BertPreTokenizer"})",
     "Hello, world! I'm here.",
     {"Hello", ",", "world", "!", "I", "'", "m", "here", "."}},
    {R"({"type":"CharDelimiterSplit","delimiter":"|"})", "a|b||c", {"a", "b", "c"}},
    {R"({"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},{"type":"Digits","individual_digits":true}]})",
     "ab12 c3",
     {"ab", "1", "2", "c", "3"}},
    {R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'ll)|\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})",
     "HE'S 12345 \u017f's  x",
     {"HE", "'S", "\u0120", "123", "45", "\u0120", "\u00c5\u00bf", "'s", "\u0120", "\u0120", "x"}},
    // Capturing groups (nested, optional, not taking part, named, back-referenced): HF splits on
    // the whole match and ignores the groups.
    {R"j({"type":"Split","pattern":{"Regex":"(\\d+)"},"behavior":"Isolated","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's ", "123", " don't ", "45", "x'ta'sb ", "77"}},
    {R"j({"type":"Split","pattern":{"Regex":"(\\d+)"},"behavior":"Removed","invert":true})j",
     "it's 123 don't 45x'ta'sb 77",
     {"123", "45", "77"}},
    {R"j({"type":"Split","pattern":{"Regex":"('s|'t)"},"behavior":"MergedWithPrevious","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's", " 123 don't", " 45x't", "a's", "b 77"}},
    {R"j({"type":"Split","pattern":{"Regex":"('s|'t)"},"behavior":"MergedWithNext","invert":true})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's", " 123 don't", " 45x't", "a's", "b 77"}},
    {R"j({"type":"Split","pattern":{"Regex":"((a)|(b))"},"behavior":"Isolated","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's 123 don't 45x't", "a", "'s", "b", " 77"}},
    {R"j({"type":"Split","pattern":{"Regex":"(x)?\\d"},"behavior":"Contiguous","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's ", "123", " don't ", "45", "x'ta'sb ", "77"}},
    {R"j({"type":"Split","pattern":{"Regex":"(x)?\\d"},"behavior":"MergedWithNext","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's ", "1", "2", "3 don't ", "4", "5x'ta'sb ", "7", "7"}},
    {R"j({"type":"Split","pattern":{"Regex":"(?<n>\\d)(\\d)?"},"behavior":"Removed","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's ", " don't ", "x'ta'sb "}},
    {R"j({"type":"Split","pattern":{"Regex":"(\\d)\\1"},"behavior":"Isolated","invert":false})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it's 123 don't 45x'ta'sb ", "77"}},
    {R"j({"type":"Split","pattern":{"Regex":"(?:'s)|('t)"},"behavior":"Contiguous","invert":true})j",
     "it's 123 don't 45x'ta'sb 77",
     {"it", "'s", " 123 don", "'t", " 45x", "'t", "a", "'s", "b 77"}},
};

TEST(PreTokenizer, MatchesHuggingFace) {
    for (const PreTokenizerCase& c : kCases) {
        Result<std::unique_ptr<PreTokenizer>> p = pre_tokenizer_from_json(c.json, "test.json");
        ASSERT_TRUE(p.ok()) << c.json << ": " << p.status().to_string();
        Result<std::vector<std::string>> pieces = (*p)->split_to_strings(c.input);
        ASSERT_TRUE(pieces.ok()) << c.json << ": " << pieces.status().to_string();
        EXPECT_EQ(*pieces, c.expected) << c.json;
    }
}

TEST(PreTokenizer, MetaspaceFirstPrependsOnlyAtTheOrigin) {
    auto p = pre_tokenizer_from_json(
        R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":true})",
        "t");
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    PieceList pieces, scratch;
    ASSERT_TRUE((*p)->split("a b", pieces, scratch, /*at_origin=*/true).ok());
    ASSERT_EQ(pieces.size(), 2u);
    EXPECT_EQ(pieces.view(0), "\u2581a");
    ASSERT_TRUE((*p)->split("a b", pieces, scratch, /*at_origin=*/false).ok());
    ASSERT_EQ(pieces.size(), 2u);
    EXPECT_EQ(pieces.view(0), "a");
    EXPECT_EQ(pieces.view(1), "\u2581b");
}

TEST(PreTokenizer, PieceListsAreReusable) {
    auto p = pre_tokenizer_from_json(R"({"type":"WhitespaceSplit"})", "t");
    ASSERT_TRUE(p.ok());
    PieceList pieces, scratch;
    ASSERT_TRUE((*p)->split("one two three", pieces, scratch).ok());
    EXPECT_EQ(pieces.size(), 3u);
    ASSERT_TRUE((*p)->split("four", pieces, scratch).ok());
    ASSERT_EQ(pieces.size(), 1u);
    EXPECT_EQ(pieces.view(0), "four");
    ASSERT_TRUE((*p)->split("", pieces, scratch).ok());
    EXPECT_TRUE(pieces.empty());
}

// A pattern that backtracks exponentially gives up on a short text: split returns an error, in
// a Split (any behavior) and inside a Sequence, and the next text splits as usual.
TEST(PreTokenizer, PatternThatGivesUpIsAnError) {
    const std::string text = std::string(100, 'a') + "b";
    for (const char* behavior : {"Isolated", "Removed"}) {
        const std::string split = fmt::format(
            R"({{"type":"Split","pattern":{{"Regex":"(a|aa)+$"}},"behavior":"{}","invert":false}})",
            behavior);
        for (const std::string& json :
             {split, fmt::format(R"({{"type":"Sequence","pretokenizers":[{},)"
                                 R"({{"type":"ByteLevel","add_prefix_space":false,)"
                                 R"("trim_offsets":true,"use_regex":false}}]}})",
                                 split)}) {
            auto p = pre_tokenizer_from_json(json, "t");
            ASSERT_TRUE(p.ok()) << json << ": " << p.status().to_string();
            PieceList pieces, scratch;
            const Status s = (*p)->split(text, pieces, scratch);
            ASSERT_FALSE(s.ok()) << json;
            EXPECT_NE(s.message().find("'(a|aa)+$' gave up on this text of 101 bytes"),
                      std::string::npos)
                << s.message();
            EXPECT_NE(s.message().find("split or shorten the text"), std::string::npos)
                << s.message();
            EXPECT_TRUE(pieces.empty());
            EXPECT_FALSE((*p)->split_to_strings(text).ok());
            ASSERT_TRUE((*p)->split("baa", pieces, scratch).ok()) << json;
            ASSERT_FALSE(pieces.empty()) << json;
            EXPECT_EQ(pieces.view(0), "b") << json;
        }
    }
}

TEST(PreTokenizer, ErrorsNameThePath) {
    auto r = pre_tokenizer_from_json(
        R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"a"},"behavior":"Isolatd","invert":false}]})",
        "tok.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("tok.json: pre_tokenizer.pretokenizers[0].behavior"),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("did you mean 'Isolated'"), std::string::npos);
    auto legacy = pre_tokenizer_from_json(
        R"({"type":"Metaspace","replacement":"_","add_prefix_space":false})", "t");
    EXPECT_FALSE(legacy.ok()) << "HF rejects add_prefix_space false with the default scheme";
    auto scripts = pre_tokenizer_from_json(R"({"type":"UnicodeScripts"})", "t");
    ASSERT_FALSE(scripts.ok());
    EXPECT_EQ(scripts.status().code(), StatusCode::kUnimplemented);
}

TEST(ByteLevelAlphabet, IsGpt2sBytesToUnicode) {
    EXPECT_EQ(byte_level_char(' '), U'\u0120');
    EXPECT_EQ(byte_level_char('\n'), U'\u010a');
    EXPECT_EQ(byte_level_char('A'), U'A');
    EXPECT_EQ(byte_level_char(0xAD), U'\u0143');
    EXPECT_EQ(byte_level_char(0xFF), U'\u00ff');
    EXPECT_EQ(byte_level_symbol(' '), "\u0120");
    for (int b = 0; b < 256; ++b) {
        const auto byte = static_cast<uint8_t>(b);
        ASSERT_EQ(byte_level_byte(byte_level_char(byte)), byte);
    }
    EXPECT_FALSE(byte_level_byte(U'\u0144').has_value());
    std::string all, back;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    std::string mapped;
    byte_level_encode(all, mapped);
    ASSERT_TRUE(byte_level_decode(mapped, back));
    EXPECT_EQ(back, all);
    std::string untouched = "x";
    EXPECT_FALSE(byte_level_decode("a\u4e2d", untouched));
    EXPECT_EQ(untouched, "x");
}

// Oniguruma constructs whose PCRE2 meaning differs are translated.
TEST(Regex, TranslatesOnigurumaClasses) {
    EXPECT_EQ(regex_translate_oniguruma(R"(\s+(?!\S))"), R"(\p{White_Space}+(?!\P{White_Space}))");
    EXPECT_EQ(regex_translate_oniguruma(R"([^\s\p{L}])"), R"([^\p{White_Space}\p{L}])");
    EXPECT_EQ(regex_translate_oniguruma(R"(\w[\w-])"),
              R"([\p{L}\p{M}\p{N}\p{Pc}][\p{L}\p{M}\p{N}\p{Pc}-])");
    EXPECT_EQ(regex_translate_oniguruma(R"(\h\u00e9(?m:.))"), R"([0-9a-fA-F]\x{00e9}(?s:.))");
    EXPECT_EQ(regex_translate_oniguruma(R"([]\\s])"), R"([]\\s])");  // escaped backslash, then 's'
}

// Behaviours checked against HF's Split pre-tokenizer (tokenizers 0.23.3).
TEST(Regex, MatchesOnigurumaSemantics) {
    auto spans = [](std::string_view pattern, std::string_view text) {
        Result<Regex> re = Regex::from_oniguruma(pattern);
        EXPECT_TRUE(re.ok()) << re.status().to_string();
        std::vector<std::pair<size_t, size_t>> out;
        re->find_iter(text, [&](size_t b, size_t e) { out.emplace_back(b, e); });
        return out;
    };
    using V = std::vector<std::pair<size_t, size_t>>;
    // \s is White_Space: U+0085 and U+00A0 yes, U+180E (Mongolian vowel separator) no.
    EXPECT_EQ(spans(R"(\s)", "a\u180eb\u0085c\u00a0d"), (V{{5, 7}, {8, 10}}));
    // (?i) folds s to U+017F (long s).
    EXPECT_EQ(spans("(?i:s)", "S\u017fsx"), (V{{0, 1}, {1, 3}, {3, 4}}));
    // ^ and $ are line anchors.
    EXPECT_EQ(spans("a$", "a\na a"), (V{{0, 1}, {4, 5}}));
    // Empty matches: one per position, none right after a non-empty match.
    EXPECT_EQ(spans("x*", "abxxc"), (V{{0, 0}, {1, 1}, {2, 4}, {5, 5}}));
    // Capturing groups give the whole match, whether or not each group takes part.
    EXPECT_EQ(spans(R"((\d+))", "a12b3"), (V{{1, 3}, {4, 5}}));
    EXPECT_EQ(spans(R"(((a)|(b))(c)?)", "acb"), (V{{0, 2}, {2, 3}}));
    EXPECT_EQ(spans(R"((x)?(?<d>\d)(\d)?)", "x123"), (V{{0, 3}, {3, 4}}));
    EXPECT_EQ(spans(R"((\w)\1)", "abba"), (V{{1, 3}}));
    // Many groups (more than any match data sized for a few pairs).
    std::string many;
    for (int i = 0; i < 40; ++i) many += "(a)?";
    EXPECT_EQ(spans(many + "b", "aab"), (V{{0, 3}}));
}

}  // namespace
}  // namespace lathe
