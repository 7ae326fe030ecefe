#include "align/stage_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/file.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

class StageCacheTest : public ::testing::Test {
protected:
    void SetUp() override {
        dir_ = (fs::temp_directory_path() /
                ("lathe_stage_cache_test_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                   .string();
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& name) const { return dir_ + "/" + name; }
    void write(const std::string& name, const std::string& data) {
        ASSERT_TRUE(file_write_atomic(path(name), data).ok());
    }
    StageFingerprint make(const std::string& input, int k) {
        StageFingerprint fp("terms");
        fp.add_setting("top_k", k);
        EXPECT_TRUE(fp.add_input("corpus", input).ok());
        return fp;
    }
    std::string dir_;
};

TEST_F(StageCacheTest, HashIsStableAndSensitive) {
    EXPECT_EQ(stage_hash_hex("abc"), stage_hash_hex("abc"));
    EXPECT_EQ(stage_hash_hex("abc").size(), 32u);
    EXPECT_NE(stage_hash_hex("abc"), stage_hash_hex("abd"));
    EXPECT_NE(stage_hash_hex(""), stage_hash_hex(std::string(1, '\0')));
    // Same bytes in the last partial word, different length.
    EXPECT_NE(stage_hash_hex(std::string("a\0", 2)), stage_hash_hex("a"));
}

TEST_F(StageCacheTest, UpToDateOnlyAfterManifestAndWhileNothingChanges) {
    write("in.txt", "hello world\n");
    write("out.tsv", "term\tcount\n");
    auto fp = make(path("in.txt"), 10);
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), fp));  // no manifest yet
    ASSERT_TRUE(stage_write_manifest(path("out.tsv"), fp, {path("out.tsv")}).ok());
    EXPECT_TRUE(fs::exists(stage_manifest_path(path("out.tsv"))));
    EXPECT_TRUE(stage_up_to_date(path("out.tsv"), make(path("in.txt"), 10)));
    // A different setting.
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), make(path("in.txt"), 11)));
    // A different stage name with the same settings.
    StageFingerprint other("embed");
    other.add_setting("top_k", 10);
    ASSERT_TRUE(other.add_input("corpus", path("in.txt")).ok());
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), other));
}

TEST_F(StageCacheTest, SmallInputsAreHashedByContent) {
    write("in.txt", "hello world\n");
    write("out.tsv", "x\n");
    ASSERT_TRUE(
        stage_write_manifest(path("out.tsv"), make(path("in.txt"), 1), {path("out.tsv")}).ok());
    // Rewriting identical bytes (new mtime) keeps the stage up to date; so does a copy elsewhere.
    write("in.txt", "hello world\n");
    EXPECT_TRUE(stage_up_to_date(path("out.tsv"), make(path("in.txt"), 1)));
    write("copy.txt", "hello world\n");
    EXPECT_TRUE(stage_up_to_date(path("out.tsv"), make(path("copy.txt"), 1)));
    // Same size, different bytes.
    write("in.txt", "hello World\n");
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), make(path("in.txt"), 1)));
}

TEST_F(StageCacheTest, ChangedOrMissingOutputsRerun) {
    write("in.txt", "a\n");
    write("out.tsv", "1\n");
    write("out.json", "{}\n");
    auto fp = make(path("in.txt"), 1);
    ASSERT_TRUE(
        stage_write_manifest(path("out.tsv"), fp, {path("out.tsv"), path("out.json")}).ok());
    EXPECT_TRUE(stage_up_to_date(path("out.tsv"), fp));
    write("out.json", "{}\n");  // rewritten: same size, new mtime
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), fp));
    ASSERT_TRUE(
        stage_write_manifest(path("out.tsv"), fp, {path("out.tsv"), path("out.json")}).ok());
    EXPECT_TRUE(stage_up_to_date(path("out.tsv"), fp));
    fs::remove(path("out.json"));
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), fp));
}

TEST_F(StageCacheTest, CorruptManifestMeansRun) {
    write("in.txt", "a\n");
    write("out.tsv", "1\n");
    auto fp = make(path("in.txt"), 1);
    write("out.tsv.stage.json", "{not json");
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), fp));
    write("out.tsv.stage.json", "{\"stage\": \"terms\"}");
    EXPECT_FALSE(stage_up_to_date(path("out.tsv"), fp));
}

TEST_F(StageCacheTest, FoldersAndErrors) {
    fs::create_directories(path("ckpt/sub"));
    write("ckpt/a.json", "{}");
    write("ckpt/sub/b.bin", "xyz");
    StageFingerprint a("apply");
    ASSERT_TRUE(a.add_input("model", path("ckpt")).ok());
    StageFingerprint b("apply");
    ASSERT_TRUE(b.add_input("model", path("ckpt")).ok());
    EXPECT_EQ(a.digest(), b.digest());
    write("ckpt/sub/c.bin", "");
    StageFingerprint c("apply");
    ASSERT_TRUE(c.add_input("model", path("ckpt")).ok());
    EXPECT_NE(a.digest(), c.digest());

    StageFingerprint missing("apply");
    Status s = missing.add_input("model", path("nope"));
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_NE(s.message().find("model"), std::string::npos);
    EXPECT_NE(s.message().find("nope"), std::string::npos);

    EXPECT_FALSE(stage_write_manifest(path("out"), a, {path("missing-output")}).ok());
}

TEST_F(StageCacheTest, SettingsRenderCanonically) {
    StageFingerprint fp("x");
    fp.add_setting("a", 0.1);
    fp.add_setting("b", true);
    fp.add_setting("c", uint64_t{7});
    fp.add_setting("d", "line\nbreak");
    EXPECT_NE(fp.canonical().find("setting a=0.10000000000000001\n"), std::string::npos);
    EXPECT_NE(fp.canonical().find("setting b=true\n"), std::string::npos);
    EXPECT_NE(fp.canonical().find("setting c=7\n"), std::string::npos);
    EXPECT_NE(fp.canonical().find("setting d=line\\nbreak\n"), std::string::npos);
    EXPECT_NE(fp.description_json().find("\"a\":\"0.10000000000000001\""), std::string::npos);
}

}  // namespace
}  // namespace lathe
