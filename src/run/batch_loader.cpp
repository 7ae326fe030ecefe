#include "run/batch_loader.h"

#include <exception>

#include "core/check.h"
#include "data/sampling.h"

namespace lathe {

Status fill_batch(const SampleSource& source, int64_t first_index, int64_t B, int64_t T,
                  bool per_doc, BatchBuffers& buf) {
    buf.tokens.resize(size_t(B * T));
    buf.targets.resize(size_t(B * T));
    buf.docs.resize(per_doc ? size_t(B * T) : 0);
    for (int64_t b = 0; b < B; ++b) {
        LATHE_RETURN_IF_ERROR(source.get(buf.sample, first_index + b));
        const Sample& s = buf.sample;
        LATHE_CHECK(int64_t(s.tokens.size()) == T + 1, "sample of {} tokens, expected {}",
                    s.tokens.size(), T + 1);
        for (int64_t t = 0; t < T; ++t) {
            buf.tokens[size_t(b * T + t)] = s.tokens[size_t(t)];
            int32_t target = s.tokens[size_t(t + 1)];
            // GPT-NeoX with a label file: the label is the target; negative labels carry no loss.
            if (!s.labels.empty())
                target = s.labels[size_t(t + 1)] >= 0 ? s.labels[size_t(t + 1)] : -100;
            buf.targets[size_t(b * T + t)] = target;
        }
        if (per_doc) {
            int32_t ordinal = 0;
            for (const DocumentSegment& seg : s.documents) {
                for (int64_t t = seg.start; t < seg.start + seg.length && t < T; ++t)
                    buf.docs[size_t(b * T + t)] = ordinal;
                ++ordinal;
            }
        }
    }
    return ok_status();
}

ModelBatch batch_views(const BatchBuffers& buf, int64_t B, int64_t T) {
    ModelBatch mb;
    mb.tokens = ConstTensorView(buf.tokens.data(), DType::kI32, Shape{B, T});
    mb.targets = ConstTensorView(buf.targets.data(), DType::kI32, Shape{B, T});
    if (!buf.docs.empty()) mb.docs = ConstTensorView(buf.docs.data(), DType::kI32, Shape{B, T});
    return mb;
}

BatchLoader::BatchLoader(const SampleSource& source, int64_t begin, int64_t end, int64_t B,
                         int64_t T, bool per_doc, int depth, int dp_world, int dp_rank)
    : source_(source),
      begin_(begin),
      end_(end),
      B_(B),
      T_(T),
      per_doc_(per_doc),
      dp_world_(dp_world),
      dp_rank_(dp_rank) {
    LATHE_CHECK(depth >= 1 && begin <= end, "BatchLoader depth {} over [{}, {})", depth, begin,
                end);
    // `depth` filled ahead plus the one the caller holds.
    slots_.resize(size_t(depth) + 1);
    thread_ = std::thread([this] { run(); });
}

BatchLoader::~BatchLoader() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void BatchLoader::run() {
    const int64_t n = end_ - begin_, ring = int64_t(slots_.size());
    for (int64_t i = 0; i < n; ++i) {
        Slot* slot = nullptr;
        {
            // Slot i % ring is free once micro-batch i - ring was released, i.e. once the caller
            // moved past it: consumed_ counts it and the one after it was handed out.
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || i - consumed_ < ring - 1; });
            if (stop_) return;
            slot = &slots_[size_t(i % ring)];
        }
        Status status;
        try {
            Result<int64_t> first =
                gpt_neox_micro_batch_start(begin_ + i, B_, dp_world_, dp_rank_, source_.size());
            status = first.ok() ? fill_batch(source_, *first, B_, T_, per_doc_, slot->buf)
                                : first.status();
        } catch (const std::exception& e) {
            status = internal_error("reading micro-batch {}: {}", begin_ + i, e.what());
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            slot->status = std::move(status);
            ++filled_;
            if (!slot->status.ok()) stop_ = true;  // nothing after a failed read is wanted
        }
        cv_.notify_all();
        if (!slot->status.ok()) return;
    }
}

Result<const BatchBuffers*> BatchLoader::next(int64_t index) {
    const int64_t i = index - begin_, ring = int64_t(slots_.size());
    LATHE_CHECK(i == consumed_ && index < end_,
                "BatchLoader: micro-batch {} asked for, {} is next of [{}, {})", index,
                begin_ + consumed_, begin_, end_);
    std::unique_lock<std::mutex> lock(mu_);
    // Counting this one releases the previous micro-batch's buffer (the model copied it).
    ++consumed_;
    cv_.notify_all();
    Slot& slot = slots_[size_t(i % ring)];
    cv_.wait(lock, [&] { return filled_ > i; });
    if (!slot.status.ok()) return slot.status;
    return &slot.buf;
}

}  // namespace lathe
