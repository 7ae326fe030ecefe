#include "run/run_list.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace lathe {
namespace {

namespace fs = std::filesystem;

class RunListTest : public ::testing::Test {
protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() /
                ("lathe_run_list_" + std::to_string(getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(root_);
        fs::create_directories(root_);
    }
    void TearDown() override { fs::remove_all(root_); }

    // A run folder with a config.yaml of `steps` steps and the given metrics lines.
    void make_run(const std::string& name, int steps, const std::string& metrics) {
        const fs::path run = root_ / name;
        fs::create_directories(run);
        std::ofstream(run / "config.yaml")
            << "model:\n  family: llama\n  hidden_size: 48\n  num_hidden_layers: 2\n"
               "data:\n  path: d\n  tokenizer: t.json\ntrain:\n  steps: "
            << steps << "\n";
        std::ofstream(run / "metrics.jsonl") << metrics;
    }

    fs::path root_;
};

std::string train_line(int step, double loss, double tok_s) {
    return "{\"step\": " + std::to_string(step) +
           ", \"split\": \"train\", \"loss\": " + std::to_string(loss) +
           ", \"tokens_per_s\": " + std::to_string(tok_s) + "}\n";
}

std::string valid_line(int step, double loss) {
    return "{\"step\": " + std::to_string(step) +
           ", \"split\": \"valid\", \"loss\": " + std::to_string(loss) + "}\n";
}

TEST_F(RunListTest, FinishedStoppedNoValidationAndMalformed) {
    make_run("a-finished", 4,
             train_line(2, 5.5, 1000) + valid_line(2, 5.25) + train_line(4, 4.5, 2000) +
                 valid_line(4, 5.5));
    make_run("b-stopped", 10, train_line(3, 6.0, 1500));
    make_run("c-novalid", 2, train_line(1, 7.0, 10) + train_line(2, 6.5, 20));
    make_run("d-malformed", 4, train_line(1, 7.0, 10) + "{\"step\": 2, \"spl\n");
    fs::create_directories(root_ / "e-checkpoints-only" / "checkpoints");
    fs::create_directories(root_ / "not-a-run");

    auto rows = run_list(root_.string());
    ASSERT_TRUE(rows.ok()) << rows.status().message();
    ASSERT_EQ(rows->size(), 5u);

    const RunRow& fin = (*rows)[0];
    EXPECT_EQ(fin.name, "a-finished");
    EXPECT_EQ(fin.model, "llama L=2 C=48");
    EXPECT_EQ(fin.steps_done, 4);
    EXPECT_EQ(fin.steps_total, 4);
    EXPECT_DOUBLE_EQ(*fin.last_loss, 4.5);
    EXPECT_DOUBLE_EQ(*fin.best_valid_loss, 5.25);
    EXPECT_DOUBLE_EQ(*fin.tokens_per_s, 2000);
    EXPECT_EQ(fin.status, "finished");

    const RunRow& stopped = (*rows)[1];
    EXPECT_EQ(stopped.steps_done, 3);
    EXPECT_EQ(stopped.steps_total, 10);
    EXPECT_EQ(stopped.status, "stopped at step 3");

    const RunRow& novalid = (*rows)[2];
    EXPECT_EQ(novalid.status, "finished");
    EXPECT_FALSE(novalid.best_valid_loss.has_value());
    EXPECT_DOUBLE_EQ(*novalid.last_loss, 6.5);

    const RunRow& bad = (*rows)[3];
    EXPECT_EQ(bad.status, "unreadable: metrics.jsonl line 2");
    EXPECT_FALSE(bad.last_loss.has_value());

    const RunRow& bare = (*rows)[4];
    EXPECT_EQ(bare.model, "");
    EXPECT_FALSE(bare.steps_total.has_value());
    EXPECT_EQ(bare.status, "stopped at step 0");

    const std::string table = run_list_table(*rows);
    EXPECT_NE(table.find("name"), std::string::npos);
    EXPECT_NE(table.find("4/4"), std::string::npos) << table;
    EXPECT_NE(table.find("3/10"), std::string::npos) << table;
    EXPECT_NE(table.find("unreadable: metrics.jsonl line 2"), std::string::npos) << table;
    EXPECT_NE(table.find("—"), std::string::npos) << table;

    const auto j = run_row_to_json(novalid);
    EXPECT_TRUE(j["best_valid_loss"].is_null());
    EXPECT_EQ(j["steps_total"], 2);
    EXPECT_EQ(j["status"], "finished");
}

TEST_F(RunListTest, MissingFolderNamesIt) {
    const std::string missing = (root_ / "nope").string();
    auto rows = run_list(missing);
    ASSERT_FALSE(rows.ok());
    EXPECT_NE(rows.status().message().find(missing), std::string::npos);
}

}  // namespace
}  // namespace lathe
