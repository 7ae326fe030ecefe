#include "io/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/file.h"

namespace lathe {
namespace {

// CRC-32C bit by bit (reflected polynomial 0x82F63B78), written here so that the tests do not
// check crc32c() against itself.
uint32_t reference_crc32c(std::string_view data) {
    uint32_t c = 0xffffffffu;
    for (unsigned char byte : data) {
        c ^= byte;
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
    }
    return c ^ 0xffffffffu;
}

uint32_t reference_masked(std::string_view data) {
    const uint32_t c = reference_crc32c(data);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

uint64_t read_le(std::string_view s, size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
    return v;
}

std::string bytes(std::initializer_list<int> b) {
    std::string s;
    for (int x : b) s.push_back(char(x));
    return s;
}

TEST(Crc32c, KnownVectors) {
    EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value
    EXPECT_EQ(crc32c(""), 0u);
    EXPECT_EQ(reference_crc32c("123456789"), 0xE3069283u);
    // Masked values computed with a separate bitwise CRC-32C in Python.
    EXPECT_EQ(tfrecord_masked_crc("123456789"), 0xc78ab0e5u);
    EXPECT_EQ(tfrecord_masked_crc("hello"), 0x191c1fbbu);
    const std::string text = "The quick brown fox jumps over the lazy dog, 0123456789 times.";
    for (size_t n = 0; n <= text.size(); ++n)
        EXPECT_EQ(crc32c(text.substr(0, n)), reference_crc32c(text.substr(0, n))) << n;
}

TEST(TfRecord, FrameLayout) {
    const std::string f = tfrecord_frame("hello");
    ASSERT_EQ(f.size(), 12u + 5u + 4u);
    EXPECT_EQ(read_le(f, 0, 8), 5u);
    EXPECT_EQ(read_le(f, 8, 4), 0x3e04b2eau);  // masked CRC of the 8 length bytes (Python)
    EXPECT_EQ(f.substr(12, 5), "hello");
    EXPECT_EQ(read_le(f, 17, 4), 0x191c1fbbu);
    const std::string empty = tfrecord_frame("");
    ASSERT_EQ(empty.size(), 16u);
    EXPECT_EQ(read_le(empty, 12, 4), reference_masked(""));
}

TEST(TensorBoardEvent, WireBytes) {
    // wall_time = 1 (fixed64 1.5), step = 2 (varint 7), summary = 5 { value = 1 { tag = 1 "a",
    // simple_value = 2 (fixed32 2.0f) } }: the field numbers TensorBoard reads.
    EXPECT_EQ(tensorboard_scalars_event(7, 1.5, {{"a", 2.0f}}),
              bytes({0x09, 0,    0,    0,    0,    0,   0,    0xf8, 0x3f, 0x10, 0x07, 0x2a,
                     0x0a, 0x0a, 0x08, 0x0a, 0x01, 'a', 0x15, 0,    0,    0,    0x40}));
    // A zero is written too (simple_value is in a oneof).
    EXPECT_EQ(tensorboard_scalars_event(0, 0.0, {{"z", 0.0f}}),
              bytes({0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, 'z', 0x15, 0, 0, 0, 0}));
    // session_log = 7 { status = 1 START (1) }.
    EXPECT_EQ(tensorboard_start_event(5, 1.5),
              bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x05, 0x3a, 0x02, 0x08, 0x01}));
    // file_version = 3.
    EXPECT_EQ(tensorboard_version_event(1.5),
              bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 0x0d}) + "brain.Event:2");
}

TEST(TensorBoardWriter, WritesFramedEventsIntoANewFile) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("lathe_tb_test_" + std::to_string(::getpid())) / "tb";
    std::filesystem::remove_all(dir.parent_path());
    std::string first_path;
    {
        auto w = TensorBoardWriter::open(dir.string(), 1);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        first_path = w->path();
        ASSERT_TRUE(w->write_scalars(3, {{"train/loss", 2.5f}, {"train/lr", 1e-4f}}).ok());
        // Flushed: the bytes are in the file while the writer is open.
        auto text = file_read_all(first_path);
        ASSERT_TRUE(text.ok());
        EXPECT_GT(text->size(), 0u);
    }
    const std::string name = std::filesystem::path(first_path).filename().string();
    EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
    EXPECT_TRUE(name.ends_with("." + std::to_string(::getpid()) + ".lathe")) << name;

    auto text = file_read_all(first_path);
    ASSERT_TRUE(text.ok());
    std::vector<std::string> records;
    size_t at = 0;
    while (at < text->size()) {
        ASSERT_LE(at + 12, text->size());
        const uint64_t n = read_le(*text, at, 8);
        EXPECT_EQ(read_le(*text, at + 8, 4), reference_masked(text->substr(at, 8)));
        ASSERT_LE(at + 12 + n + 4, text->size());
        const std::string data = text->substr(at + 12, n);
        EXPECT_EQ(read_le(*text, at + 12 + n, 4), reference_masked(data));
        records.push_back(data);
        at += 12 + n + 4;
    }
    ASSERT_EQ(records.size(), 3u);
    EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
    EXPECT_EQ(records[1].substr(9), bytes({0x10, 0x01, 0x3a, 0x02, 0x08, 0x01}));  // START at 1
    EXPECT_NE(records[2].find("train/loss"), std::string::npos);
    EXPECT_NE(records[2].find("train/lr"), std::string::npos);

    // A second writer on the same folder, in the same second, starts another file that sorts
    // after the first.
    auto again = TensorBoardWriter::open(dir.string(), 4);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_GT(again->path(), first_path);
    std::filesystem::remove_all(dir.parent_path());
}

TEST(TensorBoardWriter, UncreatableFolderIsAnError) {
    const auto base = std::filesystem::temp_directory_path() /
                      ("lathe_tb_test_file_" + std::to_string(::getpid()));
    ASSERT_TRUE(file_write_atomic(base.string(), "x").ok());
    auto w = TensorBoardWriter::open((base / "tb").string(), 1);
    EXPECT_FALSE(w.ok());
    EXPECT_NE(w.status().to_string().find(base.string()), std::string::npos);
    std::filesystem::remove(base);
}

}  // namespace
}  // namespace lathe
