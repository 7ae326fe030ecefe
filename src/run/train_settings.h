#pragma once
// `lathe train`'s configuration, checked and resolved before any work starts: every value in
// range, the model built from an HF config.json or inline keys, the vocabulary sized from the
// tokenizer, the sequence length within what the model allows, the data in GPT-NeoX's terms.
// Every error names the config key (and, through io/config.h, the file and line it came from).

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/blend.h"
#include "io/config.h"
#include "model/fp8_state.h"
#include "model/host_memory_plan.h"
#include "model/memory_plan.h"
#include "model/model_config.h"
#include "ops/adamw.h"
#include "optim/adamw_optimizer.h"
#include "run/lr_schedule.h"

namespace lathe {

enum class NonfinitePolicy { kSkip, kStop };
enum class InitMode { kFinetune, kContinue };

struct TrainSettings {
    ModelConfig model;
    std::string model_source;  // "model.config=...json", "checkpoint.init_from=...", "inline"

    std::string tokenizer_path;
    int64_t tokenizer_vocab = 0;  // the tokenizer's own size (ids < this)

    GptNeoxDataArgs data;
    bool per_document_attention = false;

    int64_t seq_len = 0;      // T
    int64_t micro_batch = 0;  // B
    int64_t grad_accum = 1;   // K
    int64_t steps = 0;
    int64_t log_interval = 10;
    int64_t eval_interval = 0;  // 0 = never
    int64_t eval_iters = 0;
    uint64_t seed = 0;
    int threads = 0;                         // 0 = all cores
    std::string device = "auto";             // auto | cpu | cuda (train.device)
    std::string precision = "bf16";          // fp32 | bf16 | fp8 (train.precision)
    bool deterministic = true;               // train.deterministic
    Recompute recompute = Recompute::kNone;  // train.recompute

    NonfinitePolicy nonfinite = NonfinitePolicy::kSkip;
    int64_t max_skipped = 10;
    double spike_factor = 0.0;
    std::vector<std::string> freeze;  // glob patterns over parameter names

    LrSchedule lr;
    double weight_decay = 0.0;
    AdamWHyper adam;
    double grad_clip = 0.0;  // 0 = off
    // optimizer.offload, optimizer.offload_fraction, optimizer.state_dtype (validated; the
    // moments' storage of the device optimizer, or with offload of the host's).
    OffloadSettings offload;
    // optimizer.schedule: the device AdamW's (optim/adamw_optimizer.h); unset: serial. The
    // trainer refuses overlapped with several ranks; with offload the key is refused here
    // (optimizer.offload_schedule is that optimizer's).
    OptimizerSchedule schedule = OptimizerSchedule::kSerial;
    // optimizer.overlap_sms: the SMs the forward's GEMMs leave to the overlapped update
    // (AdamWOptimizer::overlap_with); set only with optimizer.schedule: overlapped.
    int optimizer_sms = 0;

    int64_t checkpoint_interval = 0;  // 0 = only at the end
    int keep_last = 0;
    std::string init_from;
    InitMode init_mode = InitMode::kFinetune;

    int zero_stage = 1;      // parallel.zero_stage: 0, 1 or 2
    double timeout_s = 600;  // parallel.timeout_s; 0 = off
    int tensor = 1;          // parallel.tensor: ranks of a tensor-parallel group
    // parallel.sequence_parallel: with tensor > 1, the residual stream's rows are cut over the
    // tensor-parallel group (model/block.h).
    bool sequence_parallel = true;
    // parallel.tensor_overlap: with sequence parallel, the layer's collectives run beside its
    // GEMMs (model/block.h, "Overlap"); parallel.tensor_overlap_chunks: the forward's pipeline
    // depth, 1 to 8.
    bool tensor_overlap = true;
    int tensor_overlap_chunks = 1;
    // parallel.tensor_overlap_sms: SMs left to the collectives while the GEMMs run beside them.
    int tensor_overlap_sms = 0;
    int64_t world = 1;  // data-parallel ranks: set by the trainer from the launcher

    bool tensorboard = true;  // logging.tensorboard: event files in RUN_DIR/tb/
    Fp8Settings fp8;          // fp8.*: the recipe of train.precision fp8 (checked in every run)

    // Samples per optimizer step over all ranks, and their tokens.
    int64_t global_batch() const { return micro_batch * grad_accum * world; }
    int64_t tokens_per_step() const { return global_batch() * seq_len; }
};

// GPT-NeoX's padded vocabulary: the smallest multiple of `divisible_by` >= vocab.
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by);

// Resolves and checks `config` (built with train_config_schema()).
Result<TrainSettings> train_settings_resolve(const Config& config);

// True when `name` matches the glob `pattern` ('*' any run, '?' one character).
bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace lathe
