#include "run/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "io/file.h"

namespace lathe {
namespace {

TEST(Metrics, FloatsRoundTripBitForBit) {
    const float loss = 3.14159274f * 1.0000001f;
    const std::string line =
        metrics_line({{"step", int64_t{3}}, {"loss", loss}, {"split", std::string("train")}});
    const size_t at = line.find("\"loss\": ") + 8;
    const float back = std::strtof(line.c_str() + at, nullptr);
    EXPECT_EQ(std::memcmp(&back, &loss, sizeof(float)), 0) << line;
    EXPECT_NE(line.find("\"split\": \"train\""), std::string::npos);
}

TEST(Metrics, ResumeCutsBackToCheckpointStep) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("lathe_metrics_" + std::to_string(getpid()) + ".jsonl"))
                                 .string();
    {
        auto m = MetricsLog::open(path, -1);
        ASSERT_TRUE(m.ok());
        for (int64_t s = 1; s <= 5; ++s)
            ASSERT_TRUE(m->write({{"step", s}, {"loss", 1.0 / s}}).ok());
    }
    // Simulate a line cut by a kill.
    {
        std::FILE* f = std::fopen(path.c_str(), "ab");
        std::fputs("{\"step\": 6, \"lo", f);
        std::fclose(f);
    }
    auto m = MetricsLog::open(path, 3);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(m->write({{"step", int64_t{4}}}).ok());
    auto text = file_read_all(path);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 4);
    EXPECT_NE(text->find("{\"step\": 3"), std::string::npos);
    EXPECT_EQ(text->find("{\"step\": 5"), std::string::npos);
    EXPECT_EQ(text->find("lo\n"), std::string::npos);
}

// A damaged line in the middle (an edit, not a kill) loses that line alone: the run's later
// lines through the checkpoint step stay.
TEST(Metrics, ResumeKeepsTheLinesAfterADamagedOne) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("lathe_metrics_mid_" + std::to_string(getpid()) + ".jsonl"))
                                 .string();
    ASSERT_TRUE(file_write_atomic(path,
                                  "{\"step\": 1}\nGARBAGE\n{\"step\": 3}\n{\"step\": 4}\n"
                                  "{\"step\": 5}\n{\"step\": 6, \"lo")
                    .ok());
    auto m = MetricsLog::open(path, 4);
    ASSERT_TRUE(m.ok());
    auto text = file_read_all(path);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, "{\"step\": 1}\n{\"step\": 3}\n{\"step\": 4}\n");
}

}  // namespace
}  // namespace lathe
