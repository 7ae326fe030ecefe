// io/json.h: the nesting bound every nlohmann parse of an input goes through.
#include "io/json.h"

#include <gtest/gtest.h>

#include <string>

namespace lathe {
namespace {

std::string nested(int64_t depth, std::string_view inner = "") {
    return std::string(size_t(depth), '[') + std::string(inner) + std::string(size_t(depth), ']');
}

TEST(JsonDepth, CountsArraysAndObjectsOutsideStrings) {
    EXPECT_EQ(json_depth("1"), 0);
    EXPECT_EQ(json_depth(R"({"a": [1, {"b": []}]})"), 4);
    EXPECT_EQ(json_depth(R"({"a": "[[[{{{\"[[["})"),
              1);  // brackets and an escaped quote in a string
    EXPECT_EQ(json_depth(R"([[]], [[[]]])"), 3);
    EXPECT_EQ(json_depth(nested(50), 10), 11);  // stops counting past the limit
}

TEST(JsonParse, RefusesNestingPastTheBoundAndSaysWhy) {
    const std::string at = nested(kJsonMaxDepth), past = nested(kJsonMaxDepth + 1);
    EXPECT_FALSE(json_parse<nlohmann::json>(at).is_discarded());
    EXPECT_EQ(json_problem(at), "");
    EXPECT_TRUE(json_parse<nlohmann::json>(past).is_discarded());
    EXPECT_TRUE(json_parse<nlohmann::ordered_json>(past).is_discarded());
    EXPECT_EQ(json_problem(past), "it nests arrays and objects deeper than 1024 levels");
    // Deep enough to overflow the stack of a recursive walk; refused without one.
    EXPECT_TRUE(json_parse<nlohmann::json>(nested(1'000'000)).is_discarded());
}

TEST(JsonParse, InvalidTextIsDiscardedWithTheParsersPosition) {
    EXPECT_TRUE(json_parse<nlohmann::json>("{\"a\": x}").is_discarded());
    const std::string why = json_problem("{\"a\": x}");
    EXPECT_NE(why.find("line 1, column 7"), std::string::npos) << why;
    EXPECT_EQ(why.find("json.exception"), std::string::npos) << why;
    EXPECT_EQ(json_parse<nlohmann::json>(R"({"a": [1, 2]})")["a"][1], 2);
}

}  // namespace
}  // namespace lathe
