#include "io/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

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

// A FIFO at the output path is written in place (its reader gets the bytes) and stays a FIFO; a
// folder is an error.
TEST(AtomicFile, SpecialFilesAreWrittenInPlaceAndFoldersRefused) {
    const std::string fifo = temp_dir() + "/pipe";
    std::filesystem::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    std::string got;
    std::thread reader([&] {
        std::FILE* in = std::fopen(fifo.c_str(), "rb");
        char buf[64];
        for (size_t n; in != nullptr && (n = std::fread(buf, 1, sizeof buf, in)) > 0;)
            got.append(buf, n);
        if (in != nullptr) std::fclose(in);
    });
    {
        auto f = AtomicFile::create(fifo);
        ASSERT_TRUE(f.ok()) << f.status().to_string();
        EXPECT_TRUE(f->write("through the pipe").ok());
        EXPECT_TRUE(f->commit().ok());
    }
    reader.join();
    EXPECT_EQ(got, "through the pipe");
    EXPECT_TRUE(std::filesystem::is_fifo(fifo));
    auto null = AtomicFile::create("/dev/null");
    ASSERT_TRUE(null.ok()) << null.status().to_string();
    EXPECT_TRUE(null->write("x").ok());
    EXPECT_TRUE(null->commit().ok());
    EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
    auto folder = AtomicFile::create(temp_dir());
    ASSERT_FALSE(folder.ok());
    EXPECT_NE(folder.status().message().find("is a folder"), std::string::npos);
}

TEST(CheckOutputIsNotInput, RefusesTheSameFileByAnyPath) {
    const std::string in = temp_dir() + "/in.jsonl", link = temp_dir() + "/link.jsonl";
    ASSERT_TRUE(file_write_atomic(in, "{}\n").ok());
    std::filesystem::remove(link);
    std::filesystem::create_symlink(in, link);
    const Status same = check_output_is_not_input("--output", link, "--input", in);
    ASSERT_FALSE(same.ok());
    EXPECT_EQ(same.message(), "--output " + link +
                                  " is the --input file: writing it would replace the input; "
                                  "write the output elsewhere");
    EXPECT_TRUE(
        check_output_is_not_input("--output", temp_dir() + "/new.jsonl", "--input", in).ok());
    EXPECT_TRUE(check_output_is_not_input("--output", "-", "--input", "-").ok());
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

// Names in `dir`, sorted.
std::vector<std::string> listing(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

TEST(StagedFolder, UncommittedLeavesNothingBehind) {
    const std::string root = temp_dir() + "/staged_drop";
    std::filesystem::remove_all(root);
    {
        auto s = StagedFolder::create(root + "/out");
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        EXPECT_EQ(std::filesystem::path(s->path()).parent_path().string(), root);
        ASSERT_TRUE(file_write_atomic(s->file("a.txt"), "a").ok());
        EXPECT_FALSE(std::filesystem::exists(root + "/out"));
    }
    EXPECT_TRUE(listing(root).empty());
}

TEST(StagedFolder, CommitReplacesAnExistingFolderWhole) {
    const std::string root = temp_dir() + "/staged_replace";
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root + "/out");
    ASSERT_TRUE(file_write_atomic(root + "/out/old.txt", "old").ok());
    auto s = StagedFolder::create(root + "/out");
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ASSERT_TRUE(file_write_atomic(s->file("new.txt"), "new").ok());
    // Until commit() the old folder is untouched.
    EXPECT_EQ(listing(root + "/out"), std::vector<std::string>{"old.txt"});
    ASSERT_TRUE(s->commit().ok());
    EXPECT_EQ(listing(root + "/out"), std::vector<std::string>{"new.txt"});
    EXPECT_EQ(*file_read_all(root + "/out/new.txt"), "new");
    // Neither the staging folder nor the moved-aside old one remains.
    EXPECT_EQ(listing(root), std::vector<std::string>{"out"});
    EXPECT_EQ(s->commit().code(), StatusCode::kFailedPrecondition);
}

TEST(OutputFolderCheck, RefusesFileAndNonEmptyFolderWithoutOverwrite) {
    const std::string root = temp_dir() + "/output_check";
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root + "/empty");
    std::filesystem::create_directories(root + "/full");
    ASSERT_TRUE(file_write_atomic(root + "/full/x", "x").ok());
    ASSERT_TRUE(file_write_atomic(root + "/file", "x").ok());
    EXPECT_TRUE(output_folder_check(root + "/new", false, "OUT").ok());
    EXPECT_TRUE(output_folder_check(root + "/empty", false, "OUT").ok());
    EXPECT_TRUE(output_folder_check(root + "/full", true, "OUT").ok());
    const Status full = output_folder_check(root + "/full", false, "OUT");
    EXPECT_EQ(full.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(full.message().find("not empty"), std::string::npos) << full.to_string();
    EXPECT_NE(full.message().find("--overwrite"), std::string::npos) << full.to_string();
    const Status file = output_folder_check(root + "/file", true, "OUT");
    EXPECT_EQ(file.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(file.message().find("not a folder"), std::string::npos) << file.to_string();
}

// One holder at a time (flock locks belong to an open file, so a second open in this very
// process conflicts as another process would); the holder's line is what the others read; the
// lock goes with the object.
TEST(FileLock, OneHolderAtATimeAndItsLineIsReadBack) {
    const std::string path = temp_dir() + "/file_lock";
    std::filesystem::remove(path);
    EXPECT_FALSE(FileLock::holder(path).has_value());  // missing file: nobody
    {
        Result<FileLock> a = FileLock::try_exclusive(path, "pid 1 on host a");
        ASSERT_TRUE(a.ok()) << a.status().to_string();
        EXPECT_EQ(FileLock::holder(path), std::optional<std::string>("pid 1 on host a"));
        Result<FileLock> b = FileLock::try_exclusive(path, "pid 2 on host b");
        ASSERT_FALSE(b.ok());
        EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(b.status().message(), "pid 1 on host a");
        FileLock moved = std::move(a).value();  // a move keeps the lock
        EXPECT_TRUE(FileLock::holder(path).has_value());
    }
    EXPECT_FALSE(FileLock::holder(path).has_value());  // released: the file stays, unlocked
    Result<FileLock> c = FileLock::try_exclusive(path, "pid 3 on host c");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(FileLock::holder(path), std::optional<std::string>("pid 3 on host c"));
    EXPECT_FALSE(FileLock::try_exclusive(temp_dir() + "/no/such/dir/lock", "x").ok());
}

}  // namespace
}  // namespace lathe
