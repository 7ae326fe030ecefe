// LineOutput: a file appears under its name only at commit(); an output dropped before commit
// leaves nothing; a missing folder is an error at open().
#include "data/line_output.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace lathe {
namespace {

std::filesystem::path temp_dir() {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_line_output_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir;
}

TEST(LineOutput, FileAppearsAtCommit) {
    const std::string path = (temp_dir() / "out.jsonl").string();
    std::filesystem::remove(path);
    auto out = LineOutput::open(path);
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_TRUE(out->write("a\n").ok());
    ASSERT_TRUE(out->write("b\n").ok());
    EXPECT_FALSE(std::filesystem::exists(path));
    ASSERT_TRUE(out->commit().ok());
    std::ifstream f(path, std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "a\nb\n");
}

TEST(LineOutput, DroppedBeforeCommitLeavesNothing) {
    const auto dir = temp_dir() / "dropped";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    {
        auto out = LineOutput::open((dir / "out.jsonl").string());
        ASSERT_TRUE(out.ok()) << out.status().message();
        ASSERT_TRUE(out->write("partial\n").ok());
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(LineOutput, MissingFolderIsAnError) {
    auto out = LineOutput::open((temp_dir() / "no_such_folder" / "out.jsonl").string());
    EXPECT_FALSE(out.ok());
}

}  // namespace
}  // namespace lathe
