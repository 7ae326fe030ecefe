#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace lathe {
namespace {

TEST(Utf8FindInvalid, NamesTheOffsetLineColumnAndByteOfTheFirstBadSequence) {
    EXPECT_FALSE(utf8::find_invalid("").has_value());
    EXPECT_FALSE(utf8::find_invalid("caf\xc3\xa9\nna\xc3\xafve\n").has_value());

    // On the first line: the column is the offset + 1.
    auto at = utf8::find_invalid("\xff rest");
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(at->offset, 0u);
    EXPECT_EQ(at->line, 1u);
    EXPECT_EQ(at->column, 1u);
    EXPECT_EQ(at->byte, 0xff);

    // Latin-1 'é' (0xe9) on the third line, after a valid two-byte character on the second.
    const std::string text = "first\n\xc3\xa9t\xc3\xa9\nabc\xe9 d\n\xfe";
    at = utf8::find_invalid(text);
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(at->offset, text.find('\xe9'));
    EXPECT_EQ(at->line, 3u);
    EXPECT_EQ(at->column, 4u);
    EXPECT_EQ(at->byte, 0xe9);

    // A truncated sequence right after a newline: column 1 of its line.
    at = utf8::find_invalid("ok\n\xe2\x82");
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(at->offset, 3u);
    EXPECT_EQ(at->line, 2u);
    EXPECT_EQ(at->column, 1u);
    EXPECT_EQ(at->byte, 0xe2);
}

}  // namespace
}  // namespace lathe
