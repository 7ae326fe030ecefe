#include "core/strings.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/status.h"

namespace lathe {
namespace {

TEST(Strings, EditDistance) {
    EXPECT_EQ(edit_distance("", ""), 0u);
    EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
    EXPECT_EQ(edit_distance("train.steps", "train.step"), 1u);
}

TEST(Strings, ClosestMatchSuggestsTyposOnly) {
    const std::vector<std::string> keys = {"train.steps", "train.log_interval", "data.path"};
    EXPECT_EQ(closest_match("train.stpes", keys), "train.steps");
    EXPECT_EQ(closest_match("data.pth", keys), "data.path");
    EXPECT_EQ(closest_match("completely.different", keys), "");
    EXPECT_EQ(did_you_mean("data.paht", keys), ", did you mean 'data.path'?");
}

TEST(Strings, SplitTrimEscape) {
    const auto parts = split("a,b,,c", ',');
    ASSERT_EQ(parts.size(), 4u);
    EXPECT_EQ(parts[2], "");
    EXPECT_EQ(trim("  x y \n"), "x y");
    EXPECT_EQ(escape_for_message("a\nb\x01"), "a\\nb\\x01");
    EXPECT_EQ(escape_for_message("abcdef", 3), "abc...");
}

Result<int> parse_positive(int x) {
    if (x <= 0) return invalid_argument_error("x must be positive, got {}", x);
    return x;
}

Status use_parse(int x, int* out) {
    LATHE_ASSIGN_OR_RETURN(*out, parse_positive(x));
    return ok_status();
}

TEST(Status, ResultAndMacros) {
    int v = 0;
    EXPECT_TRUE(use_parse(3, &v).ok());
    EXPECT_EQ(v, 3);
    const Status s = use_parse(-1, &v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.to_string(), "invalid argument: x must be positive, got -1");
    EXPECT_EQ(s.with_context("f.yaml").message(), "f.yaml: x must be positive, got -1");
}

TEST(Strings, JsonString) {
    EXPECT_EQ(json_string(""), "\"\"");
    EXPECT_EQ(json_string("a\"b\\c/d"), "\"a\\\"b\\\\c/d\"");
    EXPECT_EQ(json_string("\n\r\t\b\f"), "\"\\n\\r\\t\\b\\f\"");
    EXPECT_EQ(json_string(std::string_view("\x00\x01\x1f\x20", 4)), "\"\\u0000\\u0001\\u001f \"");
    // DEL and UTF-8 (here "é" and "Ġ") pass through unchanged.
    EXPECT_EQ(json_string("\x7f\xc3\xa9\xc4\xa0"), "\"\x7f\xc3\xa9\xc4\xa0\"");
    std::string out = "[";
    append_json_string(out, "x");
    EXPECT_EQ(out, "[\"x\"");
    // Every byte below 0x20 other than the five with short forms is written as \u00xx.
    for (int c = 0; c < 0x20; ++c) {
        if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') continue;
        EXPECT_EQ(json_string(std::string(1, char(c))), fmt::format("\"\\u{:04x}\"", c)) << c;
    }
}

}  // namespace
}  // namespace lathe
