// Tokenizer::encode/decode, the BPE model, added tokens, post-processors and decoders against
// Hugging Face `tokenizers`. Every expected id list and string below was produced by tokenizers
// 0.23.3 (Python) from the same tokenizer.json text: `Tokenizer.from_str(json).encode(text,
// add_special_tokens=...).ids`, and `decoder.decode(tokens)` for the decoder cases.

#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tokenizer/decoder.h"

namespace lathe {
namespace {

constexpr std::string_view k_merges_string_form =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "ab": 16, "abc": 17, "bc": 18}, "merges": ["a b", "ab c", "b c"]}})JSON";
constexpr std::string_view k_merges_pair_form =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "bc": 16, "abc": 17, "ab": 18}, "merges": [["b", "c"], ["a", "bc"], ["a", "b"]]}})JSON";
constexpr std::string_view k_unk_not_fused =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15}, "merges": []}})JSON";
constexpr std::string_view k_unk_fused =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15}, "merges": []}})JSON";
constexpr std::string_view k_no_unk_drops =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15}, "merges": []}})JSON";
constexpr std::string_view k_byte_fallback =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "<0xC3>": 16, "<0xA9>": 17, "<0xE2>": 18, "<0x82>": 19, "<0xAC>": 20, "ab": 21}, "merges": ["a b"]}})JSON";
constexpr std::string_view k_prefix_suffix =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "##a": 16, "##b": 17, "##c": 18, "a</w>": 19, "b</w>": 20, "c</w>": 21, "##a</w>": 22, "##b</w>": 23, "##c</w>": 24, "ab": 25, "ab</w>": 26, "abc</w>": 27}, "merges": ["a ##b", "ab ##c</w>", "a ##b</w>"]}})JSON";
constexpr std::string_view k_ignore_merges =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "ab": 16, "abc": 17, "cab": 18}, "merges": ["a b"]}})JSON";
constexpr std::string_view k_no_ignore_merges =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "ab": 16, "abc": 17, "cab": 18}, "merges": ["a b"]}})JSON";
constexpr std::string_view k_added_tokens =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [{"id": 17, "content": "<sp>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 18, "content": "[L]", "single_word": false, "lstrip": true, "rstrip": false, "normalized": false, "special": false}, {"id": 19, "content": "[R]", "single_word": false, "lstrip": false, "rstrip": true, "normalized": false, "special": false}, {"id": 20, "content": "word", "single_word": true, "lstrip": false, "rstrip": false, "normalized": false, "special": false}, {"id": 21, "content": "HeY", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}, {"id": 22, "content": "<sp>x", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 1, "content": "a", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}], "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15}, "merges": []}})JSON";
constexpr std::string_view k_metaspace_first =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [{"id": 20, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}], "normalizer": null, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "▁": 16, "▁a": 17, "▁b": 18}, "merges": [["▁", "a"], ["▁", "b"]]}})JSON";
constexpr std::string_view k_template =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [{"id": 17, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}, {"id": 18, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}], "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [17], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [18], "tokens": ["</s>"]}}}, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "<s>": 16, "</s>": 17}, "merges": []}})JSON";
constexpr std::string_view k_roberta =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 18], "cls": ["<s>", 17], "trim_offsets": true, "add_prefix_space": false}, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "<s>": 16, "</s>": 17}, "merges": []}})JSON";
constexpr std::string_view k_sequence_post =
    R"JSON({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}, {"type": "BertProcessing", "sep": ["</s>", 18], "cls": ["<s>", 17]}]}, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "h": 6, "i": 7, "l": 8, "o": 9, "r": 10, "s": 11, "w": 12, "x": 13, "y": 14, "z": 15, "<s>": 16, "</s>": 17}, "merges": []}})JSON";

struct EncodeCase {
    const char* name;
    std::string_view json;
    std::string_view text;
    std::vector<int32_t> ids;               // add_special_tokens=False
    std::vector<int32_t> ids_with_special;  // add_special_tokens=True
};

// Crafted to exercise what the shared tokenizer files do not: unk (fused or not, or absent),
// byte_fallback, continuing_subword_prefix/end_of_word_suffix, ignore_merges, both merge forms,
// added tokens with lstrip/rstrip/single_word/normalized (and HF's id assignment on load: the
// file's ids 17.. become 16.., "a" keeps the model's id 1), Metaspace prepend_scheme "first"
// after a special token, TemplateProcessing, RobertaProcessing and a Sequence post-processor.
const EncodeCase kEncodeCases[] = {
    {"merges_string_form",
     k_merges_string_form,
     "abc ab bca cab",
     {17, 16, 18, 1, 3, 16},
     {17, 16, 18, 1, 3, 16}},
    {"merges_string_form", k_merges_string_form, "aabbcc", {1, 16, 18, 3}, {1, 16, 18, 3}},
    {"merges_pair_form",
     k_merges_pair_form,
     "abc ab bca cab",
     {17, 18, 16, 1, 3, 18},
     {17, 18, 16, 1, 3, 18}},
    {"merges_pair_form", k_merges_pair_form, "aabbcc", {1, 18, 16, 3}, {1, 18, 16, 3}},
    {"unk_not_fused", k_unk_not_fused, "aqqb", {1, 0, 0, 2}, {1, 0, 0, 2}},
    {"unk_not_fused", k_unk_not_fused, "q", {0}, {0}},
    {"unk_not_fused", k_unk_not_fused, "qq a", {0, 0, 1}, {0, 0, 1}},
    {"unk_fused", k_unk_fused, "aqqb", {1, 0, 2}, {1, 0, 2}},
    {"unk_fused", k_unk_fused, "q", {0}, {0}},
    {"unk_fused", k_unk_fused, "qq a qxq", {0, 1, 0, 13, 0}, {0, 1, 0, 13, 0}},
    {"no_unk_drops", k_no_unk_drops, "aqqb", {1, 2}, {1, 2}},
    {"no_unk_drops", k_no_unk_drops, "q", {}, {}},
    {"byte_fallback", k_byte_fallback, "ab\u00e9", {21, 16, 17}, {21, 16, 17}},
    {"byte_fallback", k_byte_fallback, "\u20ac", {18, 19, 20}, {18, 19, 20}},
    {"byte_fallback", k_byte_fallback, "q\u00e9q", {16, 17, 0}, {16, 17, 0}},
    {"byte_fallback", k_byte_fallback, "qq\u00e9\u00e9", {16, 17, 16, 17, 0}, {16, 17, 16, 17, 0}},
    {"prefix_suffix",
     k_prefix_suffix,
     "abc ab a abcab",
     {27, 26, 19, 25, 18, 16, 23},
     {27, 26, 19, 25, 18, 16, 23}},
    {"prefix_suffix", k_prefix_suffix, "cab", {3, 16, 23}, {3, 16, 23}},
    {"ignore_merges", k_ignore_merges, "abc cab ab", {17, 18, 16}, {17, 18, 16}},
    {"no_ignore_merges", k_no_ignore_merges, "abc cab ab", {16, 3, 3, 16, 16}, {16, 3, 3, 16, 16}},
    {"added_tokens", k_added_tokens, "x<sp>y", {13, 16, 14}, {13, 16, 14}},
    {"added_tokens", k_added_tokens, "a  [L] b", {1, 17, 2}, {1, 17, 2}},
    {"added_tokens", k_added_tokens, "a [R]   b", {1, 18, 2}, {1, 18, 2}},
    {"added_tokens",
     k_added_tokens,
     "word sword words word.",
     {19, 11, 12, 9, 10, 4, 12, 9, 10, 4, 11, 19, 0},
     {19, 11, 12, 9, 10, 4, 12, 9, 10, 4, 11, 19, 0}},
    {"added_tokens", k_added_tokens, "hey HEY hEy", {20, 20, 20}, {20, 20, 20}},
    {"added_tokens", k_added_tokens, "<sp>xx <sp>", {21, 13, 16}, {21, 13, 16}},
    {"added_tokens", k_added_tokens, "b[L][R]c", {2, 17, 18, 3}, {2, 17, 18, 3}},
    {"added_tokens", k_added_tokens, "ba", {2, 1}, {2, 1}},
    {"metaspace_first", k_metaspace_first, "a b", {17, 18}, {17, 18}},
    {"metaspace_first", k_metaspace_first, "<s>a b", {19, 1, 18}, {19, 1, 18}},
    {"metaspace_first", k_metaspace_first, "a<s>b", {17, 19, 2}, {17, 19, 2}},
    {"metaspace_first", k_metaspace_first, " a", {17}, {17}},
    {"template", k_template, "a b", {1, 2}, {17, 1, 2, 18}},
    {"template", k_template, "", {}, {17, 18}},
    {"template", k_template, "<s>c</s>", {16, 3, 17}, {17, 16, 3, 17, 18}},
    {"roberta", k_roberta, "a b", {1, 2}, {17, 1, 2, 18}},
    {"roberta", k_roberta, "", {}, {17, 18}},
    {"sequence_post", k_sequence_post, "a b", {1, 2}, {17, 1, 2, 18}},
};

TEST(Tokenizer, EncodesAsHuggingFace) {
    for (const EncodeCase& c : kEncodeCases) {
        Result<Tokenizer> tok = Tokenizer::from_json(c.json, c.name);
        ASSERT_TRUE(tok.ok()) << c.name << ": " << tok.status().to_string();
        Result<std::vector<int32_t>> ids = tok->encode(c.text, false);
        ASSERT_TRUE(ids.ok()) << ids.status().to_string();
        EXPECT_EQ(*ids, c.ids) << c.name << " text=" << c.text;
        Result<std::vector<int32_t>> with = tok->encode(c.text, true);
        ASSERT_TRUE(with.ok()) << with.status().to_string();
        EXPECT_EQ(*with, c.ids_with_special) << c.name << " (special) text=" << c.text;
    }
}

TEST(Tokenizer, AddedTokenIdsAndSpecialFlags) {
    Result<Tokenizer> tok = Tokenizer::from_json(k_added_tokens, "added");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    // HF: ids follow the model's 16 entries in file order; "a" keeps its model id.
    EXPECT_EQ(tok->token_to_id("<sp>"), 16);
    EXPECT_EQ(tok->token_to_id("<sp>x"), 21);
    EXPECT_EQ(tok->token_to_id("a"), 1);
    EXPECT_EQ(tok->vocab_size(), 22);
    EXPECT_TRUE(tok->is_special(16));
    EXPECT_FALSE(tok->is_special(17));
    EXPECT_FALSE(tok->is_special(1));
    // A normalized added token decodes (and reads back) in its normalized form, as in HF.
    EXPECT_EQ(tok->id_to_token(20), "hey");
    EXPECT_EQ(tok->id_to_token(2), "b");
    EXPECT_FALSE(tok->id_to_token(99).has_value());
}

TEST(Tokenizer, DecodeSkipsSpecialTokensAndRejectsUnknownIds) {
    Result<Tokenizer> tok = Tokenizer::from_json(k_template, "template");
    ASSERT_TRUE(tok.ok());
    // The added <s> and </s> took the model's ids 16 and 17 (HF's rule); the template's own ids
    // (17, 18) are what the file says.
    const std::vector<int32_t> ids = {16, 1, 2, 17};
    // No decoder: tokens joined with spaces (HF's fallback).
    EXPECT_EQ(*tok->decode(ids, /*skip_special=*/true), "a b");
    EXPECT_EQ(*tok->decode(ids, /*skip_special=*/false), "<s> a b </s>");
    const std::vector<int32_t> bad = {1, 500};
    Result<std::string> r = tok->decode(bad, true);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("id 500 (position 1)"), std::string::npos)
        << r.status().message();
}

TEST(Tokenizer, RejectsInvalidUtf8) {
    Result<Tokenizer> tok = Tokenizer::from_json(k_unk_fused, "t");
    ASSERT_TRUE(tok.ok());
    Result<std::vector<int32_t>> r = tok->encode("ab\xC3(", false);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("offset 2"), std::string::npos) << r.status().message();
}

// A pre-tokenizer pattern that backtracks exponentially gives up on a short text: that text's
// error (the tokenizer goes on encoding others), not an abort.
TEST(Tokenizer, RegexThatGivesUpIsTheTextsError) {
    std::string json(k_merges_string_form);
    const std::string ws = R"({"type": "WhitespaceSplit"})";
    json.replace(json.find(ws), ws.size(),
                 R"({"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", )"
                 R"("invert": false})");
    Result<Tokenizer> tok = Tokenizer::from_json(json, "t");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    Result<std::vector<int32_t>> r = tok->encode(std::string(100, 'a') + "b", false);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("gave up on this text of 101 bytes"), std::string::npos)
        << r.status().message();
    Result<std::vector<int32_t>> ok = tok->encode("aab", false);
    EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

// k_merges_string_form with `field`'s null replaced by `node`.
std::string with_component(std::string_view field, std::string_view node) {
    std::string json(k_merges_string_form);
    const std::string from = fmt::format("\"{}\": null", field);
    json.replace(json.find(from), from.size(), fmt::format("\"{}\": {}", field, node));
    return json;
}

// A pattern that backtracks exponentially on a run of 'a' that does not reach the end.
constexpr std::string_view k_backtracking_replace =
    R"({"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "x"})";

// A normalizer's pattern that gives up is the text's error too (as the pre-tokenizer's).
TEST(Tokenizer, NormalizerPatternThatGivesUpIsTheTextsError) {
    Result<Tokenizer> tok = Tokenizer::from_json(
        with_component("normalizer", fmt::format(R"({{"type": "Sequence", "normalizers": )"
                                                 R"([{{"type": "Lowercase"}}, {}]}})",
                                                 k_backtracking_replace)),
        "t");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    std::vector<int32_t> ids = {7};
    const Status s = tok->encode(std::string(100, 'A') + "b", false, ids);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("gave up on this text of 101 bytes"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("split or shorten the text"), std::string::npos) << s.message();
    EXPECT_TRUE(ids.empty());
    Result<std::vector<int32_t>> ok = tok->encode("AAB aa", false);
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(*ok, (std::vector<int32_t>{1, 16, 13}));  // "aab x"
}

// A decoder's pattern that gives up is decode's error, naming the tokenizer; the Fuse step in
// front of it makes one 101-byte token of 101 ids.
TEST(Tokenizer, DecoderPatternThatGivesUpIsADecodeError) {
    Result<Tokenizer> tok = Tokenizer::from_json(
        with_component(
            "decoder",
            fmt::format(R"({{"type": "Sequence", "decoders": [{{"type": "Fuse"}}, {}]}})",
                        k_backtracking_replace)),
        "dec.json");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    std::vector<int32_t> ids(100, 1);
    ids.push_back(2);
    Result<std::string> r = tok->decode(ids, false);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("dec.json: decoder: "), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("gave up on this text of 101 bytes"), std::string::npos)
        << r.status().message();
    Result<std::string> ok = tok->decode(std::vector<int32_t>{1, 1, 2, 1}, false);
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(*ok, "aabx");
}

// An added token with normalized=true goes through the normalizer when the file loads: a pattern
// that gives up on it is a load error naming the token.
TEST(Tokenizer, AddedTokenTheNormalizerGivesUpOnIsALoadError) {
    std::string json = with_component("normalizer", k_backtracking_replace);
    const std::string from = R"("added_tokens": [])";
    json.replace(json.find(from), from.size(),
                 fmt::format(R"("added_tokens": [{{"id": 19, "content": "{}b", )"
                             R"("single_word": false, "lstrip": false, "rstrip": false, )"
                             R"("normalized": true, "special": false}}])",
                             std::string(100, 'a')));
    Result<Tokenizer> tok = Tokenizer::from_json(json, "added.json");
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.status().message().find("added.json: added token 'aaaa"), std::string::npos)
        << tok.status().message();
    EXPECT_NE(tok.status().message().find("gave up on this text of 101 bytes"), std::string::npos)
        << tok.status().message();
}

TEST(Tokenizer, LoadErrorsNameTheKey) {
    std::string json(k_merges_string_form);
    const std::string from = R"("merges": ["a b", "ab c", "b c"])";
    json.replace(json.find(from), from.size(), R"("merges": ["a b", "ab q"])");
    Result<Tokenizer> r = Tokenizer::from_json(json, "bad.json");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("bad.json: model.merges: merge 1"), std::string::npos)
        << r.status().message();
    Result<Tokenizer> wordpiece =
        Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "wp.json");
    ASSERT_FALSE(wordpiece.ok());
    EXPECT_EQ(wordpiece.status().code(), StatusCode::kUnimplemented);
    Result<Tokenizer> not_json = Tokenizer::from_json("{", "broken.json");
    ASSERT_FALSE(not_json.ok());
    EXPECT_NE(not_json.status().message().find("broken.json"), std::string::npos);
}

// A vocabulary in which a few tokens have very large ids: HF keeps ids in a map and encodes such a
// file (expected ids from tokenizers 0.23.3); lathe must not size anything by the largest id.
std::string huge_id_json(const std::string& ab_id, const std::string& added) {
    return R"({"version": "1.0", "added_tokens": [)" + added +
           R"(], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": {"a": 0, "b": 1, "c": 1000000000, "ab": )" +
           ab_id + R"(}, "merges": ["a b"]}})";
}

std::string added_json(const std::string& content, const std::string& id) {
    return R"({"id": )" + id + R"(, "content": ")" + content +
           R"(", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})";
}

TEST(Tokenizer, HugeIdsAreKeptInAMap) {
    Result<Tokenizer> tok = Tokenizer::from_json(
        huge_id_json("2147483647", added_json("<s>", "2147483647") + ", " + added_json("ab", "5") +
                                       ", " + added_json("<t>", "4294967295")),
        "huge.json");
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    // HF: "<s>" and "<t>" are new and get ids 4 and 5 (after the 4 vocabulary entries, whatever
    // the file says); "ab" keeps its vocabulary id.
    EXPECT_EQ(*tok->encode("ab c<s>ba<t>", false),
              (std::vector<int32_t>{2147483647, 1000000000, 4, 1, 0, 5}));
    EXPECT_EQ(tok->vocab_size(), int64_t{1} << 31);
    EXPECT_EQ(tok->id_to_token(2147483647), "ab");
    EXPECT_EQ(tok->id_to_token(1000000000), "c");
    EXPECT_FALSE(tok->id_to_token(1000000001).has_value());
    EXPECT_FALSE(tok->id_to_token(2147483646).has_value());
    EXPECT_EQ(*tok->decode(std::vector<int32_t>{2147483647, 4, 1000000000}, false), "ab <s> c");
}

TEST(Tokenizer, IdsOutsideTheRangeAreRefusedNamingTheToken) {
    // HF reads ids as u32: 2^32 and -1 are refused by both; 2^31 .. 2^32 - 1 by lathe only.
    for (const char* id : {"2147483648", "4294967295", "4294967296", "-1", "1.5", "\"3\""}) {
        Result<Tokenizer> r = Tokenizer::from_json(huge_id_json(id, ""), "huge.json");
        ASSERT_FALSE(r.ok()) << id;
        EXPECT_NE(r.status().message().find("huge.json: model.vocab: the id of token 'ab' is"),
                  std::string::npos)
            << r.status().message();
    }
    Result<Tokenizer> big = Tokenizer::from_json(huge_id_json("2147483648", ""), "huge.json");
    EXPECT_NE(big.status().message().find("32-bit"), std::string::npos) << big.status().message();
    // Beyond 64 bits the JSON reader itself stops: the message still shows the token.
    Result<Tokenizer> huge =
        Tokenizer::from_json(huge_id_json("100000000000000000000", ""), "huge.json");
    ASSERT_FALSE(huge.ok());
    EXPECT_NE(huge.status().message().find(
                  "huge.json: the integer in '\"ab\": 100000000000000000000' does not fit"),
              std::string::npos)
        << huge.status().message();
    // An added token's id is not used, but HF refuses a file whose id is missing or not a u32.
    for (const char* id : {"4294967296", "-1", "\"7\"", "null"}) {
        Result<Tokenizer> r =
            Tokenizer::from_json(huge_id_json("2", added_json("<s>", id)), "added.json");
        ASSERT_FALSE(r.ok()) << id;
        EXPECT_NE(r.status().message().find("added.json: added_tokens"), std::string::npos)
            << r.status().message();
        EXPECT_NE(r.status().message().find("<s>"), std::string::npos) << r.status().message();
    }
    std::string no_id = added_json("<s>", "1");
    no_id.erase(0, no_id.find("\"content\""));
    Result<Tokenizer> missing = Tokenizer::from_json(huge_id_json("2", "{" + no_id), "added.json");
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("missing \"id\""), std::string::npos)
        << missing.status().message();
}

// A file of the wrong kind says what it holds and what was expected, never the parser's raw text.
TEST(Tokenizer, WrongKindOfFileSaysWhatWasExpected) {
    struct Case {
        std::string text;
        std::string says;
    };
    const Case cases[] = {
        {"", "the file is empty"},
        {" \n\t\n", "only white space"},
        {"{\"text\": \"a\"}\n{\"text\": \"b\"}\n", "JSON Lines"},
        {"# a config\nmodel:\n  type: llama\n", "not JSON (it begins '# a config'"},
        {"[1, 2]", "a JSON array, not an object"},
        {"{\"model\": [1]", "not valid JSON"},
        {"{\"chat_template\": \"x\", \"eos_token\": \"</s>\"}", "tokenizer_config.json"},
        {"{\"architectures\": [\"X\"], \"hidden_size\": 8}", "config.json"},
        {"{\"text\": \"a\", \"id\": 3}", "without a \"model\" key (its keys: \"text\", \"id\")"},
        {"{\"model\": \"gpt2\"}", "its \"model\" is a JSON string, not an object"},
    };
    for (const Case& c : cases) {
        Result<Tokenizer> r = Tokenizer::from_json(c.text, "in.file");
        ASSERT_FALSE(r.ok()) << c.text;
        const std::string& m = r.status().message();
        EXPECT_EQ(m.rfind("in.file: ", 0), 0u) << m;
        EXPECT_NE(m.find(c.says), std::string::npos) << m;
        EXPECT_NE(m.find("expected a Hugging Face tokenizer.json"), std::string::npos) << m;
    }
    const std::string dir = ::testing::TempDir() + "/tokenizer_dir_case";
    std::filesystem::create_directories(dir);
    Result<Tokenizer> r = Tokenizer::load(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(dir + ": it is a directory"), std::string::npos)
        << r.status().message();
    { std::ofstream(dir + "/tokenizer.json") << k_unk_fused; }
    r = Tokenizer::load(dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("pass the file " + dir + "/tokenizer.json"),
              std::string::npos)
        << r.status().message();
    std::filesystem::remove_all(dir);
}

struct DecoderCase {
    std::string_view json;
    std::vector<std::string> tokens;
    std::string_view expected;
};

const DecoderCase kDecoderCases[] = {
    {R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true})",
     {"\u0120Hello", "\u0120w\u00c3\u00b6rld", "\u010a", "  raw", "\u00c3"},
     " Hello w\u00f6rld\n  raw\ufffd"},
    {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})",
     {"\u2581Hey", "\u2581friend", "\u2581\u2581x"},
     "Hey friend  x"},
    {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never","split":true})",
     {"\u2581Hey", "\u2581friend"},
     " Hey friend"},
    {R"({"type":"Replace","pattern":{"String":"▁"},"content":" "})",
     {"\u2581a\u2581", "b", ""},
     " a b"},
    {R"({"type":"ByteFallback"})",
     {"a", "<0xC3>", "<0xA9>", "b", "<0xE2>", "<0x82>", "c", "<0x61>", "<0xFF>"},
     "a\u00e9b\ufffd\ufffdc\ufffd\ufffd"},
    {R"({"type":"Fuse"})", {"a", " b", "c"}, "a bc"},
    {R"({"type":"Strip","content":" ","start":1,"stop":1})", {"  a  ", "b", "x "}, " a bx"},
    {R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})",
     {"\u2581Hello", "\u2581w", "<0xC3>", "<0xB6>", "rld", "<0xF0>", "<0x9F>"},
     "Hello w\u00f6rld\ufffd\ufffd"},
    {R"({"type":"BPEDecoder","suffix":"</w>"})", {"hel", "lo</w>", "wor", "ld</w>"}, "hello world"},
    {R"({"type":"WordPiece","prefix":"##","cleanup":true})",
     {"hello", "##s", ",", "it", "'", "s", "do", "n't", "."},
     "hellos, it ' s don't."},
};

TEST(Decoder, MatchesHuggingFace) {
    for (const DecoderCase& c : kDecoderCases) {
        simdjson::dom::parser parser;
        const std::string source = "test.json";
        Result<JsonNode> root = json_parse_root(parser, c.json, &source, "decoder");
        ASSERT_TRUE(root.ok()) << root.status().to_string();
        Result<std::unique_ptr<Decoder>> d = decoder_from_node(*root);
        ASSERT_TRUE(d.ok()) << c.json << ": " << d.status().to_string();
        Result<std::string> text = (*d)->decode(c.tokens);
        ASSERT_TRUE(text.ok()) << c.json << ": " << text.status().to_string();
        EXPECT_EQ(*text, c.expected) << c.json;
    }
}

// The shared tokenizer files (same ids as tokenizers 0.23.3 gives for this text).
std::string shared_tokenizer(const char* name) {
    return std::string(LATHE_SHARED_DIR) + "/tokenizers/" + name + ".json";
}

TEST(Tokenizer, SharedFilesSmoke) {
    const std::string text = "Hello world! It's 2024 \u00e9t\u00e9 <|endoftext|><s> \u65e5\u672c\n";
    Result<Tokenizer> gpt2 = Tokenizer::load(shared_tokenizer("gpt2"));
    ASSERT_TRUE(gpt2.ok()) << gpt2.status().to_string();
    EXPECT_EQ(gpt2->vocab_size(), 50257);
    const std::vector<int32_t> gpt2_ids = {15496, 995,  0,   632,   338, 48609, 220,
                                           25125, 2634, 220, 50256, 27,  82,    29,
                                           10545, 245,  98,  17312, 105, 198};
    EXPECT_EQ(*gpt2->encode(text, false), gpt2_ids);
    EXPECT_EQ(*gpt2->decode(gpt2_ids, true),
              "Hello world! It's 2024 \u00e9t\u00e9 <s> \u65e5\u672c\n");

    Result<Tokenizer> llama2 = Tokenizer::load(shared_tokenizer("llama2"));
    ASSERT_TRUE(llama2.ok()) << llama2.status().to_string();
    const std::vector<int32_t> llama2_ids = {
        1,   22557, 1526, 28808, 661, 28742, 28713, 28705, 28750, 28734, 28750, 28781, 7166,
        523, 28766, 416,  1009,  772, 28766, 28767, 1,     259,   29142, 29119, 13};
    EXPECT_EQ(*llama2->encode(text, true), llama2_ids);
    EXPECT_EQ(*llama2->decode(llama2_ids, false),
              "<s> Hello world! It's 2024 \u00e9t\u00e9 <|endoftext|><s>  \u65e5\u672c\n");

    Result<Tokenizer> llama3 = Tokenizer::load(shared_tokenizer("llama3"));
    ASSERT_TRUE(llama3.ok()) << llama3.status().to_string();
    EXPECT_EQ(llama3->vocab_size(), 128256);
    const std::vector<int32_t> llama3_ids = {9906, 1917,  0,     1102,   596, 220, 2366,
                                             19,   24560, 83739, 8862,   728, 428, 91,
                                             1822, 82,    29,    105180, 198};
    EXPECT_EQ(*llama3->encode(text, true), llama3_ids);
}

TEST(Tokenizer, ManyThreadsGetTheSameIds) {
    Result<Tokenizer> tok = Tokenizer::load(shared_tokenizer("gpt2"));
    ASSERT_TRUE(tok.ok());
    std::vector<std::string> texts;
    for (int i = 0; i < 200; ++i) {
        texts.push_back("document " + std::to_string(i) + " with words like tokenization, " +
                        std::string(static_cast<size_t>(i % 17), 'z') + " and \u00e9t\u00e9");
    }
    std::vector<std::vector<int32_t>> expected;
    for (const auto& t : texts) expected.push_back(*tok->encode(t, false));
    std::vector<std::thread> threads;
    std::vector<int> mismatches(4, 0);
    for (int w = 0; w < 4; ++w) {
        threads.emplace_back([&, w] {
            for (int round = 0; round < 5; ++round) {
                for (size_t i = 0; i < texts.size(); ++i) {
                    if (*tok->encode(texts[(i + static_cast<size_t>(w)) % texts.size()], false) !=
                        expected[(i + static_cast<size_t>(w)) % texts.size()]) {
                        ++mismatches[static_cast<size_t>(w)];
                    }
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace lathe
