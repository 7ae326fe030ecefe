#include "align/vectors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "io/file.h"

namespace lathe {
namespace {

std::string temp_path(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_vectors_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return (dir / name).string();
}

TEST(Vectors, WriteReadRoundTripIsExact) {
    TokenVectors v;
    v.dim = 7;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (int32_t id : {5, 0, 50256, 17}) {
        v.ids.push_back(id);
        for (int d = 0; d < v.dim; ++d) v.values.push_back(normal(rng));
    }
    v.values[3] = 1e-30f;  // tiny values and exact zeros survive too
    v.values[4] = 0.0f;
    const std::string path = temp_path("round.txt");
    ASSERT_TRUE(vectors_write_text(path, v).ok());
    auto back = vectors_read_text(path);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->dim, v.dim);
    EXPECT_EQ(back->ids, v.ids);
    EXPECT_EQ(back->values, v.values);
    EXPECT_TRUE(back->skipped.empty());
    const auto rows = back->rows_by_id(20);
    EXPECT_EQ(rows[5], 0);
    EXPECT_EQ(rows[17], 3);
    EXPECT_EQ(rows[1], -1);
}

TEST(Vectors, ReadsReferenceToolOutput) {
    // GloVe -write-header 1 with its <unk> row; fastText .vec rows end with a space.
    const std::string path = temp_path("ref.vec");
    ASSERT_TRUE(file_write_atomic(path,
                                  "3 2\n"
                                  "</s> 0.5 0.25 \n"
                                  "12 -0.125 1e-3 \n"
                                  "7 2.000000 -3.500000\r\n")
                    .ok());
    auto v = vectors_read_text(path);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->dim, 2);
    EXPECT_EQ(v->ids, (std::vector<int32_t>{12, 7}));
    EXPECT_EQ(v->values, (std::vector<float>{-0.125f, 1e-3f, 2.0f, -3.5f}));
    EXPECT_EQ(v->skipped, (std::vector<std::string>{"</s>"}));
}

TEST(Vectors, BadInputNamesFileAndLine) {
    struct Case {
        const char* text;
        const char* expect;
    };
    const Case cases[] = {
        {"1 0.5 0.5\n2 0.5\n", ":2: 1 values, but the first row has 2"},
        {"1 0.5 0.5\n1 0.1 0.2\n", ":2: token id 1 appears a second time"},
        {"1 0.5 abc\n", ":1: value 2 of token 1 is 'abc'"},
        {"1 0.5 nan\n", "not a finite number"},
        {"99999999999 0.5\n", "does not fit a 32-bit integer"},
        {"5 2\n1 0.5 0.5\n", "the header says 5 rows, the file has 1"},
        {"<unk> 0.5\n", "no token vectors"},
        {"", "no token vectors"},
        {"7\n", ":1: a row needs a token id and at least one value"},
    };
    int n = 0;
    for (const Case& c : cases) {
        const std::string path = temp_path("bad" + std::to_string(n++) + ".txt");
        ASSERT_TRUE(file_write_atomic(path, c.text).ok());
        auto v = vectors_read_text(path);
        ASSERT_FALSE(v.ok()) << c.text;
        EXPECT_NE(v.status().message().find(path), std::string::npos) << v.status().message();
        EXPECT_NE(v.status().message().find(c.expect), std::string::npos)
            << v.status().message() << " (wanted: " << c.expect << ")";
    }
    EXPECT_FALSE(vectors_read_text(temp_path("missing.txt")).ok());
}

}  // namespace
}  // namespace lathe
