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
    LATHE_RETURN_IF_ERROR(
        file_write_atomic(dir + "/trainer_state.json", fmt::format("{{\"step\": {}}}", step)));
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
    // Pruned folders are renamed out of the step names before their removal, and gone after it.
    for (const auto& e : fs::directory_iterator(d->root()))
        EXPECT_EQ(e.path().filename().string().rfind(".partial-", 0), std::string::npos)
            << e.path();
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
    // and killed while writing `latest` (file_write_atomic's temporary of another process)
    ASSERT_TRUE(file_write_atomic(root + "/latest.tmp-1", "step-00000020\n").ok());
    auto again = CheckpointDir::open(root);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(fs::exists(root + "/.partial-step-00000020"));
    EXPECT_FALSE(fs::exists(root + "/latest.tmp-1"));
    EXPECT_EQ(*file_read_all(root + "/latest"), "step-00000010\n");
    EXPECT_EQ(*again->complete_steps(), (std::vector<int64_t>{10}));
}

TEST(CheckpointDir, SameStepTwiceReplaces) {
    auto d = CheckpointDir::open(fresh_dir("twice"));
    ASSERT_TRUE(write_checkpoint(*d, 5, 0).ok());
    ASSERT_TRUE(write_checkpoint(*d, 5, 0).ok());
    EXPECT_EQ(*d->complete_steps(), (std::vector<int64_t>{5}));
    EXPECT_FALSE(d->commit(6, 0).ok());  // commit without begin
}

TEST(CheckpointDir, PartialPathIsBeginsFolder) {
    auto d = CheckpointDir::open(fresh_dir("partial_path"));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->partial_path(100), d->root() + "/.partial-step-00000100");
    EXPECT_FALSE(fs::exists(d->partial_path(100)));  // the name only
    auto begun = d->begin(100);
    ASSERT_TRUE(begun.ok());
    EXPECT_EQ(*begun, d->partial_path(100));
    EXPECT_TRUE(fs::is_directory(*begun));
    fs::remove_all(d->root());
}

// Rank 0 opens and begins, ranks 1..3 attach and write their shard files into the same partial
// folder; until every file is there and rank 0 commits, newest() is the older checkpoint.
TEST(CheckpointDir, RanksWriteOnePartialFolderThatIsNeverNewestUntilCommitted) {
    const std::string root = fresh_dir("ranks");
    auto rank0 = CheckpointDir::open(root);
    ASSERT_TRUE(rank0.ok());
    ASSERT_TRUE(write_checkpoint(*rank0, 10, 0).ok());
    EXPECT_FALSE(rank0->attached());
    auto partial = rank0->begin(20);
    ASSERT_TRUE(partial.ok());
    ASSERT_TRUE(file_write_atomic(*partial + "/config.json", "{}").ok());
    ASSERT_TRUE(
        file_write_atomic(*partial + "/optimizer.rank-00000-of-00004.safetensors", "0").ok());
    for (int r = 1; r < 4; ++r) {
        auto other = CheckpointDir::attach(root);
        ASSERT_TRUE(other.ok()) << other.status().to_string();
        EXPECT_TRUE(other->attached());
        EXPECT_EQ(other->root(), root);
        // Attaching cleans nothing: the partial folder and what rank 0 wrote stay.
        ASSERT_TRUE(fs::is_directory(other->partial_path(20)));
        EXPECT_TRUE(fs::exists(other->partial_path(20) + "/config.json"));
        if (r < 3) {  // rank 3 has not written yet
            ASSERT_TRUE(
                file_write_atomic(other->partial_path(20) +
                                      fmt::format("/optimizer.rank-{:05d}-of-00004.safetensors", r),
                                  "r")
                    .ok());
        }
        for (const CheckpointDir* d : {&*rank0, &*other}) {
            auto newest = d->newest();
            ASSERT_TRUE(newest.ok() && newest->has_value());
            EXPECT_EQ(fs::path(**newest).filename(), "step-00000010");
            EXPECT_EQ(*d->complete_steps(), (std::vector<int64_t>{10}));
        }
    }
    auto newest = CheckpointDir::newest_in(root);
    EXPECT_EQ(fs::path(**newest).filename(), "step-00000010");
    ASSERT_TRUE(
        file_write_atomic(*partial + "/optimizer.rank-00003-of-00004.safetensors", "3").ok());
    auto committed = rank0->commit(20, 0);
    ASSERT_TRUE(committed.ok()) << committed.status().to_string();
    EXPECT_EQ(fs::path(**rank0->newest()).filename(), "step-00000020");
    EXPECT_EQ(*file_read_all(*committed + "/optimizer.rank-00002-of-00004.safetensors"), "r");
    fs::remove_all(root);
}

TEST(CheckpointDir, AttachNeedsTheFolderAndCannotBeginOrCommit) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    const std::string root = fresh_dir("attach");
    auto missing = CheckpointDir::attach(root);
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(missing.status().message().find(root), std::string::npos);
    EXPECT_NE(missing.status().message().find("shares"), std::string::npos);
    EXPECT_FALSE(fs::exists(root));  // attach creates nothing
    ASSERT_TRUE(CheckpointDir::open(root).ok());
    auto other = CheckpointDir::attach(root);
    ASSERT_TRUE(other.ok());
    EXPECT_DEATH((void)other->begin(5), "begin\\(\\) on a folder attached");
    EXPECT_DEATH((void)other->commit(5, 0), "commit\\(\\) on a folder attached");
    fs::remove_all(root);
}

TEST(CheckpointDir, StepNamesBeyondInt64AreErrorsNotCrashes) {
    EXPECT_EQ(CheckpointDir::parse_step_name("step-00000100"), 100);
    EXPECT_EQ(CheckpointDir::parse_step_name("step-9223372036854775807"), INT64_MAX);
    EXPECT_FALSE(CheckpointDir::parse_step_name("step-9223372036854775808").has_value());
    EXPECT_FALSE(CheckpointDir::parse_step_name("step-99999999999999999999").has_value());
    EXPECT_FALSE(CheckpointDir::parse_step_name("step-").has_value());
    EXPECT_FALSE(CheckpointDir::parse_step_name("step-12a").has_value());
    EXPECT_FALSE(CheckpointDir::parse_step_name("step--1").has_value());
    EXPECT_FALSE(CheckpointDir::parse_step_name("latest").has_value());

    const std::string root = fresh_dir("huge");
    auto d = CheckpointDir::open(root);
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(write_checkpoint(*d, 3, 0).ok());
    fs::create_directories(root + "/step-99999999999999999999");
    auto steps = d->complete_steps();
    ASSERT_FALSE(steps.ok());
    EXPECT_NE(
        steps.status().message().find("step-99999999999999999999: not a checkpoint lathe writes"),
        std::string::npos)
        << steps.status().message();
    EXPECT_FALSE(d->newest().ok());
    fs::remove_all(root);
}

// A folder holding config.json, as resolve_checkpoint counts a complete checkpoint.
void make_checkpoint_folder(const fs::path& dir) {
    fs::create_directories(dir);
    ASSERT_TRUE(file_write_atomic((dir / "config.json").string(), "{}").ok());
}

std::string message_of(const Result<fs::path>& r) {
    return r.ok() ? "" : r.status().message();
}

TEST(ResolveCheckpoint, TakesACheckpointARunFolderItsCheckpointsAndLatest) {
    const fs::path run = fresh_dir("resolve");
    const fs::path ck = run / "checkpoints";
    make_checkpoint_folder(ck / "step-00000004");
    make_checkpoint_folder(ck / "step-00000012");
    fs::create_directories(ck / "step-00000020");           // no config.json: not complete
    make_checkpoint_folder(ck / ".partial-step-00000016");  // being written
    ASSERT_TRUE(file_write_atomic((ck / "latest").string(), "step-00000004\n").ok());

    for (const fs::path& given : {run, ck}) {
        auto r = resolve_checkpoint(given);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        EXPECT_EQ(*r, ck / "step-00000012") << given;
    }
    auto latest = resolve_checkpoint(ck / "latest");  // what it names, even when not the newest
    ASSERT_TRUE(latest.ok()) << latest.status().to_string();
    EXPECT_EQ(*latest, ck / "step-00000004");
    auto itself = resolve_checkpoint(ck / "step-00000004");
    ASSERT_TRUE(itself.ok());
    EXPECT_EQ(*itself, ck / "step-00000004");
    fs::remove_all(run);
}

TEST(ResolveCheckpoint, ErrorsNameThePathAndWhatIsAccepted) {
    const fs::path run = fresh_dir("resolve_bad");
    const fs::path ck = run / "checkpoints";
    fs::create_directories(ck);
    auto empty_run = resolve_checkpoint(run);
    EXPECT_EQ(empty_run.status().code(), StatusCode::kNotFound);
    EXPECT_NE(message_of(empty_run).find("a run folder with no complete checkpoint"),
              std::string::npos)
        << message_of(empty_run);

    auto missing = resolve_checkpoint(run / "nope");
    EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
    EXPECT_NE(message_of(missing).find((run / "nope").string() + ": no such folder"),
              std::string::npos);
    EXPECT_NE(message_of(missing).find("checkpoints/latest"), std::string::npos)
        << message_of(missing);

    ASSERT_TRUE(file_write_atomic((ck / "latest").string(), "step-00000008\n").ok());
    auto dangling = resolve_checkpoint(ck / "latest");
    EXPECT_NE(message_of(dangling).find("names step-00000008, which is not a complete checkpoint"),
              std::string::npos)
        << message_of(dangling);
    ASSERT_TRUE(file_write_atomic((ck / "latest").string(), "{\"step\": 8}").ok());
    auto garbled = resolve_checkpoint(ck / "latest");
    EXPECT_NE(message_of(garbled).find("not a checkpoint folder name"), std::string::npos)
        << message_of(garbled);

    make_checkpoint_folder(ck / "step-00000002");
    auto file = resolve_checkpoint(ck / "step-00000002" / "config.json");
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(message_of(file).find("pass the folder that holds it"), std::string::npos)
        << message_of(file);

    const fs::path plain = run / "plain";
    fs::create_directories(plain / "sub");
    auto none = resolve_checkpoint(plain);
    EXPECT_NE(message_of(none).find("no config.json, and no checkpoints/step-*/"),
              std::string::npos)
        << message_of(none);

    fs::create_directories(ck / "step-99999999999999999999");
    auto huge = resolve_checkpoint(run);
    EXPECT_NE(message_of(huge).find("does not fit in 64 bits"), std::string::npos)
        << message_of(huge);
    fs::remove_all(run);
}

}  // namespace
}  // namespace lathe
