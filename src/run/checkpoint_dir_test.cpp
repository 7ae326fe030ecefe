#include "run/checkpoint_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "io/file.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

std::string fresh_dir(const char* name) {
    const fs::path p = fs::temp_directory_path() / fmt::format("lathe_ckpt_{}_{}", name, getpid());
    fs::remove_all(p);
    return p.string();
}

Status write_checkpoint(const CheckpointDir& d, int64_t step, int keep) {
    LATHE_ASSIGN_OR_RETURN(std::string dir, d.begin(step));
    LATHE_RETURN_IF_ERROR(file_write_atomic(dir + "/trainer_state.json", fmt::format("{{\"step\": {}}}", step)));
    auto final_path = d.commit(step, keep);
    return final_path.ok() ? ok_status() : final_path.status();
}

TEST(CheckpointDir, CommitPublishesAndPrunes) {
    auto d = CheckpointDir::open(fresh_dir("prune"));
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    auto none = d->newest();
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value());
    for (int64_t s : {100, 200, 300, 400}) ASSERT_TRUE(write_checkpoint(*d, s, 2).ok());
    auto steps = d->complete_steps();
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ(*steps, (std::vector<int64_t>{300, 400}));
    auto newest = d->newest();
    ASSERT_TRUE(newest.ok() && newest->has_value());
    EXPECT_EQ(fs::path(**newest).filename(), "step-00000400");
    EXPECT_EQ(*file_read_all(d->root() + "/latest"), "step-00000400\n");
}

TEST(CheckpointDir, PartialIsNeverNewestAndIsCleanedOnOpen) {
    const std::string root = fresh_dir("partial");
    {
        auto d = CheckpointDir::open(root);
        ASSERT_TRUE(write_checkpoint(*d, 10, 0).ok());
        auto partial = d->begin(20);  // a run killed while writing step 20
        ASSERT_TRUE(partial.ok());
        ASSERT_TRUE(file_write_atomic(*partial + "/model.safetensors", "half").ok());
        auto newest = d->newest();
        EXPECT_EQ(fs::path(**newest).filename(), "step-00000010");
    }
    auto again = CheckpointDir::open(root);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(fs::exists(root + "/.partial-step-00000020"));
    EXPECT_EQ(*again->complete_steps(), (std::vector<int64_t>{10}));
}

TEST(CheckpointDir, SameStepTwiceReplaces) {
    auto d = CheckpointDir::open(fresh_dir("twice"));
    ASSERT_TRUE(write_checkpoint(*d, 5, 0).ok());
    ASSERT_TRUE(write_checkpoint(*d, 5, 0).ok());
    EXPECT_EQ(*d->complete_steps(), (std::vector<int64_t>{5}));
    EXPECT_FALSE(d->commit(6, 0).ok());  // commit without begin
}

}  // namespace
}  // namespace lathe
