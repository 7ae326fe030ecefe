#include "io/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace lathe {
namespace {

std::string temp_dir() {
    const auto dir =
        std::filesystem::temp_directory_path() / ("lathe_file_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

TEST(AtomicFile, NothingUnderFinalNameUntilCommit) {
    const std::string path = temp_dir() + "/out.bin";
    std::filesystem::remove(path);
    {
        auto f = AtomicFile::create(path);
        ASSERT_TRUE(f.ok()) << f.status().to_string();
        ASSERT_TRUE(f->write("hello").ok());
        EXPECT_FALSE(file_exists(path));
        EXPECT_TRUE(file_exists(f->temp_path()));
    }  // dropped without commit
    EXPECT_FALSE(file_exists(path));
    EXPECT_FALSE(file_exists(path + ".tmp-" + std::to_string(::getpid())));

    auto f = AtomicFile::create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->write("hello").ok());
    ASSERT_TRUE(f->commit().ok());
    auto back = file_read_all(path);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, "hello");
}

TEST(AtomicFile, MissingFolderIsAClearError) {
    auto f = AtomicFile::create("/nonexistent-dir-lathe/x.bin");
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.status().message().find("/nonexistent-dir-lathe/x.bin"), std::string::npos);
}

TEST(MappedFile, MapsAndReportsMissing) {
    const std::string path = temp_dir() + "/m.txt";
    ASSERT_TRUE(file_write_atomic(path, "abc").ok());
    auto m = MappedFile::open(path);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->view(), "abc");
    auto missing = MappedFile::open(path + ".nope");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace lathe
