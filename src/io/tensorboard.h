#pragma once
// TensorBoard event files: the scalars of a training run in the form TensorBoard (and its
// EventAccumulator) reads, written as the run goes.
//
// A file is a sequence of TFRecords, each
//   uint64 length (little endian) | uint32 masked_crc(length bytes) | data | uint32
//   masked_crc(data)
// with masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 over CRC-32C (Castagnoli, reflected,
// initial and final xor 0xffffffff). Each record's data is one serialized Event protobuf
// (io/tensorboard_event.proto): the first carries file_version "brain.Event:2", the second a
// SessionLog START at the step the writer starts from, every later one a Summary of simple_value
// scalars (f32) at a step.
//
// Files are named events.out.tfevents.<unix seconds>.<host>.<pid>.lathe, the pattern TensorBoard
// looks for in a folder; every open() starts a new one. TensorBoard reads a folder's files in name
// order as one stream, so the <unix seconds> of a new name is at least one past the newest
// events file's already there (a restart within the same second still sorts after). A resumed
// run adds a file whose START at its first step makes TensorBoard drop what the earlier files hold
// from that step on: it shows each step once, with the value the resumed run logged, as
// metrics.jsonl (cut back to the checkpoint on resume) does. Like metrics.jsonl,
// an events file is appended to and flushed after each write, so that TensorBoard shows a live run
// and a killed run keeps every record it wrote (a record cut by the kill is the only loss; the
// reader stops there).

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected) of `data`: crc32c("123456789") is
// 0xE3069283.
uint32_t crc32c(std::string_view data);

// TFRecord's masked CRC of `data` (see above).
uint32_t tfrecord_masked_crc(std::string_view data);

// One TFRecord around `data`: 12 + data.size() + 4 bytes.
std::string tfrecord_frame(std::string_view data);

struct TensorBoardScalar {
    std::string tag;  // e.g. "train/loss"
    float value = 0.0f;
};

// The serialized Event of the first record (file_version "brain.Event:2").
std::string tensorboard_version_event(double wall_time);
// The serialized Event of a SessionLog START at `step`.
std::string tensorboard_start_event(int64_t step, double wall_time);
// The serialized Event of `scalars` at `step`.
std::string tensorboard_scalars_event(int64_t step, double wall_time,
                                      const std::vector<TensorBoardScalar>& scalars);

class TensorBoardWriter {
public:
    // Creates `dir` (with its parents) and a new events file in it, whose first records are the
    // version event and a START at `start_step` (the first step this writer will log). Errors
    // name the folder or file and the OS reason.
    static Result<TensorBoardWriter> open(const std::string& dir, int64_t start_step);
    TensorBoardWriter() = default;
    TensorBoardWriter(TensorBoardWriter&& other) noexcept;
    TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept;
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
    ~TensorBoardWriter();

    bool is_open() const { return file_ != nullptr; }
    const std::string& path() const { return path_; }

    // Appends one event of `scalars` at `step`, stamped with the current time, and flushes.
    Status write_scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars);

private:
    Status append(const std::string& event);

    std::string path_;
    std::FILE* file_ = nullptr;
};

}  // namespace lathe
