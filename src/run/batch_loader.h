#pragma once
// The training loop's data loading, off the critical path: a loader thread reads the micro-batches
// of a run in order (GPT-NeoX's sequential sampler, run/trainer.h) into a small ring of host
// buffers, a few micro-batches ahead of the one the model is computing, while the main thread
// hands each filled buffer to the model (which stages it into its pinned buffer and copies it to
// the GPU asynchronously, model/model.h). The sample order, and so every loss and checkpoint, is
// that of filling each micro-batch on the main thread just before its step.
//
// Errors of the loader thread (a token file that cannot be read, a dataset too small) are kept
// with the micro-batch they belong to and returned by next() for that micro-batch, on the main
// thread, with the message the same read would have given there.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "data/gpt2_dataset.h"
#include "model/model.h"

namespace lathe {

// Host buffers of one micro-batch: (B, T) tokens, targets (-100 where a label file says no loss)
// and, with per-document attention, document ordinals.
struct BatchBuffers {
    std::vector<int32_t> tokens, targets, docs;
    Sample sample;  // the last sample read (reused, so its vectors keep their capacity)
};

// Fills `buf` with micro-batch samples [first_index, first_index + B) of `source`. Errors are the
// source's (reading the token files).
Status fill_batch(const SampleSource& source, int64_t first_index, int64_t B, int64_t T,
                  bool per_doc, BatchBuffers& buf);

// The model's view of a filled buffer (valid while `buf` is).
ModelBatch batch_views(const BatchBuffers& buf, int64_t B, int64_t T);

class BatchLoader {
public:
    // Starts the thread, which fills micro-batches [begin, end) (counted as the trainer counts
    // them: step * gradient_accumulation_steps + k) of `source`, each the samples
    // gpt_neox_micro_batch_start(i, B, dp_world, dp_rank) names (data-parallel rank dp_rank's
    // slice of the global micro-batch i), at most `depth` (>= 1) ahead of the one the caller
    // holds. `source` must outlive the loader.
    BatchLoader(const SampleSource& source, int64_t begin, int64_t end, int64_t B, int64_t T,
                bool per_doc, int depth = 2, int dp_world = 1, int dp_rank = 0);
    // Stops the thread (it finishes the micro-batch it is reading) and waits for it.
    ~BatchLoader();
    BatchLoader(const BatchLoader&) = delete;
    BatchLoader& operator=(const BatchLoader&) = delete;

    // Micro-batch `index`, which must be the next one in order (checked), waiting until it is
    // filled; releases the buffer the previous next() returned. The pointer stays valid until the
    // following next() or the loader's end. Errors: the one filling this micro-batch gave.
    Result<const BatchBuffers*> next(int64_t index);

private:
    void run();

    const SampleSource& source_;
    const int64_t begin_, end_, B_, T_;
    const bool per_doc_;
    const int dp_world_, dp_rank_;
    struct Slot {
        BatchBuffers buf;
        Status status;  // of filling buf
    };
    std::vector<Slot> slots_;  // micro-batch i lives in slots_[(i - begin_) % size]

    std::mutex mu_;
    std::condition_variable cv_;
    int64_t filled_ = 0;    // micro-batches [begin_, begin_ + filled_) are filled (or failed)
    int64_t consumed_ = 0;  // [begin_, begin_ + consumed_) were handed out; all but the last
                            // are released (the last is held until the next next())
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace lathe
