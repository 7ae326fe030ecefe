#include "run/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include <unistd.h>

#include <sys/resource.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/hash.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/gpt2_dataset.h"
#include "data/indexed_dataset.h"
#include "data/sampling.h"
#include "dist/consistency.h"
#include "dist/host_collectives.h"
#include "dist/watchdog.h"
#include "infer/tensor_parallel.h"
#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/tensorboard.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/param_staging.h"
#include "model/registry.h"
#include "ops/cuda/fp8_linear.h"
#include "ops/cuda/memory.h"
#include "ops/device_info.h"
#include "optim/adamw_optimizer.h"
#include "optim/host_optimizer.h"
#include "optim/optimizer_state.h"
#include "run/batch_loader.h"
#include "run/bench.h"
#include "run/carried_files.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "run/data_parallel.h"
#include "run/metrics.h"
#include "run/train_schema.h"
#include "run/train_settings.h"
#include "run/train_step.h"
#include "run/trainer_state.h"
#include "run/world.h"

namespace fs = std::filesystem;

namespace lathe {
namespace {

// Set by the signal handler, read by the loop between steps. A signal handler can reach nothing
// else, so this is the one process-wide variable of the trainer.
std::atomic<int> g_stop_signal{0};

// Memory in use, for the log line: on CUDA the device's (cudaMemGetInfo total - free, so other
// processes on the GPU count too), on the CPU the process's peak resident set size.
uint64_t memory_in_use_bytes(const Context& ctx) {
    if (ctx.backend == Backend::kCuda) {
        const CudaMemoryInfo m = cuda_memory_info(ctx.device);
        return m.total_bytes > m.free_bytes ? m.total_bytes - m.free_bytes : 0;
    }
    rusage usage{};
    if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
    return uint64_t(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

extern "C" void trainer_on_signal(int sig) {
    g_stop_signal.store(sig);
}

// Installs SIGTERM/SIGINT/SIGHUP handlers for the life of a run and restores the old ones after. A
// signal the process was started ignoring stays ignored: nohup's SIGHUP, a shell's SIGINT for a
// background job.
class StopSignals {
public:
    StopSignals() {
        g_stop_signal.store(0);
        struct sigaction sa {};
        sa.sa_handler = trainer_on_signal;
        sigemptyset(&sa.sa_mask);
        for (auto [sig, old] : {std::pair{SIGTERM, &old_term_}, std::pair{SIGINT, &old_int_},
                                std::pair{SIGHUP, &old_hup_}}) {
            sigaction(sig, nullptr, old);
            if (old->sa_handler != SIG_IGN) sigaction(sig, &sa, nullptr);
        }
    }
    ~StopSignals() {
        sigaction(SIGTERM, &old_term_, nullptr);
        sigaction(SIGINT, &old_int_, nullptr);
        sigaction(SIGHUP, &old_hup_, nullptr);
    }
    int received() const { return g_stop_signal.load(); }

private:
    struct sigaction old_term_ {
    }, old_int_{}, old_hup_{};
};

// A resume from `newest` (a checkpoint of `ckpt`) that failed on a damaged checkpoint: kDataLoss
// (a truncated file, NaN or infinite weights or moments) gets what to do, naming the checkpoint
// before it when there is one; any other error is returned as it is.
Status with_resume_advice(const Status& failed, const CheckpointDir& ckpt,
                          const std::string& newest) {
    if (failed.code() != StatusCode::kDataLoss) return failed;
    const std::optional<int64_t> step =
        CheckpointDir::parse_step_name(fs::path(newest).filename().string());
    std::optional<int64_t> before;
    if (Result<std::vector<int64_t>> steps = ckpt.complete_steps(); steps.ok() && step) {
        for (int64_t s : *steps)
            if (s < *step) before = s;
    }
    const std::string advice =
        before ? fmt::format("to resume from {}, the checkpoint before it, move {} out of {}",
                             CheckpointDir::step_name(*before), newest, ckpt.root())
               : std::string(
                     "it is the run's only checkpoint: start again with a new "
                     "--run-dir (checkpoint.init_from takes an earlier model)");
    return Status(failed.code(),
                  fmt::format("resuming from {}: {}; {}", newest, failed.message(), advice));
}

Status check_resume_config(const std::string& run_dir, const ConfigSchema& schema,
                           const Config& config, int world);

class Trainer {
public:
    Trainer(const TrainRequest& request, Config config, TrainSettings settings)
        : request_(request), config_(std::move(config)), s_(std::move(settings)) {}

    Status run();
    TrainOutcome outcome() const { return {stop_signal_, st_.step}; }

private:
    Status setup();
    Result<std::unique_ptr<TokenDocuments>> open_checked(const std::string& prefix);
    Status init_or_resume();
    Status load_checkpoint(const std::string& dir, bool with_optimizer_and_state);
    Status save_checkpoint();
    Status train_step(float& loss_out, float& norm_out, bool& skipped);
    Status evaluate(double& loss_out);
    Status log_line(double elapsed_s, int64_t steps_this_session);
    // On a terminal (rank 0, stderr a tty, not --quiet): a progress line redrawn in place after
    // each step, cleared before anything else is printed. Elsewhere (a log file) no-ops: the
    // interval lines alone.
    void draw_bar(double elapsed_s, int64_t steps_this_session);
    void clear_bar();
    // The interval and validation lines are info: --quiet (warnings only) drops them.
    static bool print_lines() { return log_level() <= LogLevel::kInfo; }
    // Rank 0 with logging.tensorboard: a new events file in RUN_DIR/tb/.
    Status open_tensorboard();
    // Data parallel: this process writes the run's shared files (metrics, config, the model).
    bool lead() const { return world_.rank() == 0; }
    bool multi() const { return !world_.single(); }
    // Tensor parallel (parallel.tensor > 1): groups of tp() consecutive ranks share every layer,
    // and the ranks of one tensor-parallel rank form a data-parallel group (docs/DISTRIBUTED.md).
    int tp() const { return s_.tensor; }
    // parallel.sequence_parallel under tensor parallel (model/block.h).
    bool sequence_parallel() const { return tp() > 1 && s_.sequence_parallel; }
    // The row chunks sequence parallel moves its rows in (parallel.tensor_overlap_chunks with
    // parallel.tensor_overlap, else 1; model/block.h).
    int overlap_chunks() const { return s_.tensor_overlap ? s_.tensor_overlap_chunks : 1; }
    int tp_rank() const { return tp_comm_ ? tp_comm_->rank() : 0; }
    // The data-parallel group of this rank: the world without tensor parallel.
    Communicator& dp_comm() const { return dp_comm_ ? *dp_comm_ : *world_.comm; }
    int dp_size() const { return dp_comm_ ? dp_comm_->size() : world_.size(); }
    int dp_rank() const { return dp_comm_ ? dp_comm_->rank() : world_.rank(); }
    // parallel.tensor > 1: checks the model and the world, splits the world's communicator.
    Status setup_tensor_parallel();
    // The folder of `dir` the optimizer state of this rank's data-parallel group goes in.
    std::string optimizer_dir(const std::string& dir) const;
    // Data parallel: every rank learns whether every rank's `mine` is ok, so that an error on one
    // rank (often rank 0's alone: files, data caches) stops all of them with it, instead of
    // leaving the others waiting in their next collective. Returns `mine` when it failed, else an
    // error naming `what` when another rank's failed.
    Status agree(Status mine, std::string_view what);
    // Data parallel: every rank runs the same binary and configuration (`data` false), or reads
    // the same data (true); a mismatch stops every rank, naming the key.
    Status check_ranks_agree(bool data);
    // train.precision fp8: the run's linears in fp8 (model/fp8_state.h).
    bool fp8_run() const { return s_.precision == "fp8"; }
    // The precision the run computes in, for the first log line and metrics.jsonl: "fp32" (the
    // CPU), "bf16", or "fp8 (recipe ..., gradients ..., LM head ...)".
    std::string precision_text() const;
    // fp8: the device has FP8 tensor cores and passes the FP8 self-test (one GEMM against the
    // CPU reference), before anything else is read or written.
    Status check_fp8_device();

    const TrainRequest& request_;
    Config config_;
    TrainSettings s_;
    ComputeDevice device_;  // before model_: the model's Context points into it
    World world_;           // the ranks (one without a launcher); its communicator after device_
    // Tensor parallel: this rank's tensor-parallel and data-parallel groups (split from the
    // world's communicator, destroyed before it), the model config of a rank's shard, and the
    // first error of a sum the model asked for.
    std::unique_ptr<Communicator> tp_comm_, dp_comm_;
    ModelConfig local_model_;
    Status tp_error_;
    // Sequence parallel: the moves of the residual stream's rows (before model_: the model
    // calls into it).
    std::optional<TensorParallelRowMover> tp_rows_;
    // Bounds every wait on the other ranks (parallel.timeout_s; off for one process).
    std::unique_ptr<Watchdog> watchdog_;
    FileLock run_lock_;  // rank 0: RUN_DIR/kRunLockFile, held while this process trains the run
    GptNeoxDatasets data_;
    std::optional<Model> model_;
    std::optional<AdamWOptimizer> optimizer_;  // this rank's range, on the model's device
    // optimizer.offload: cpu (one process): the masters and moments in host memory, instead of
    // optimizer_; the model reads and writes its parameter entries in its masters.
    std::optional<HostOptimizer> host_optimizer_;
    std::unique_ptr<DataParallel> dp_;  // with more than one rank
    std::vector<char> frozen_;          // per parameter entry
    std::optional<TrainStep> step_;     // the step's compute, over model_ and optimizer_
    std::optional<CheckpointDir> ckpt_;
    // The tokenizer files every checkpoint carries, read once by setup().
    std::vector<CarriedFile> tokenizer_files_;
    MetricsLog metrics_;
    std::optional<TensorBoardWriter> tb_;  // rank 0 with logging.tensorboard
    // MFU's numbers (run/bench.h): the model's flops per token and the device's peak (0: none).
    double flops_per_token_ = 0.0;
    double peak_flops_ = 0.0;
    TrainerState st_;  // the running values a checkpoint carries (run/trainer_state.h)
    std::optional<BatchLoader> loader_;  // the training micro-batches, read ahead by a thread
    BatchBuffers buf_;                   // validation micro-batches (read on this thread)
    float last_norm_ = 0.0f;
    int64_t last_fp8_gemms_ = 0;  // fp8: the FP8 GEMMs of the last step (metrics' fp8_gemms)
    int agreed_stop_ = 0;         // data parallel: the stop request every rank took from the step
    bool bar_ = false;            // draw_bar's line is on the terminal now
    double comm_wait_ms_ = 0;     // data parallel: summed over the steps since the last log line
    int64_t comm_steps_ = 0;
    int stop_signal_ = 0;                // the signal that stopped the run before its last step
    std::set<std::string> ids_checked_;  // token files whose ids open_checked() has read
    Status ids_error_;                   // the id open_checked() found outside the vocabulary
};

// Opens a token or label file of the run and checks every id against the model's vocabulary:
// data prepared with another tokenizer would index past the embedding (a CPU check failure, a
// GPU trap) at some step; here it is an error naming the file, the id and what to do. The scan
// runs at memory speed on all cores (and not at all for a uint16 file under a vocabulary of
// 65,536 or more); a file that several splits share is read once.
Result<std::unique_ptr<TokenDocuments>> Trainer::open_checked(const std::string& prefix) {
    LATHE_ASSIGN_OR_RETURN(std::unique_ptr<TokenDocuments> docs,
                           open_indexed_token_documents(prefix));
    if (ids_checked_.count(prefix) != 0) return docs;
    // The key that names the file, and whether it holds labels (negative: no loss).
    const GptNeoxDataArgs& d = s_.data;
    const struct {
        const std::vector<std::string>& list;
        const char* key;
        bool labels;
    } roles[] = {{d.train_data_paths, "data.path", false},
                 {d.valid_data_paths, "data.valid_path", false},
                 {d.test_data_paths, "data.test_path", false},
                 {d.train_label_data_paths, "data.label_path", true},
                 {d.valid_label_data_paths, "data.valid_label_path", true},
                 {d.test_label_data_paths, "data.test_label_path", true}};
    std::string key = "data.path";
    bool labels = false;
    if (prefix != d.data_path) {
        for (const auto& role : roles) {
            if (std::find(role.list.begin(), role.list.end(), prefix) != role.list.end()) {
                key = role.key;
                labels = role.labels;
                break;
            }
        }
    }
    const int64_t V = s_.model.vocab_size;
    const auto t0 = std::chrono::steady_clock::now();
    LATHE_ASSIGN_OR_RETURN(const std::optional<TokenIdOutOfRange> bad,
                           docs->find_id_outside(V, labels));
    log_debug("{}: token ids checked against the vocabulary of {} in {:.3f} s", prefix, V,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (bad) {
        const std::string where = fmt::format("{}: '{}': {}.bin, document {}, position {}", key,
                                              prefix, prefix, bad->document, bad->position);
        const std::string what_to_do = fmt::format(
            "was it prepared with another tokenizer than data.tokenizer ({}, {} ids)? Prepare it "
            "again with that tokenizer (`lathe prepare --tokenizer {} ...`), or train with the "
            "tokenizer (and model) it was prepared with",
            s_.tokenizer_path, s_.tokenizer_vocab, s_.tokenizer_path);
        // Kept for setup(), which returns it as it is (it names its key already).
        ids_error_ = labels ? invalid_argument_error(
                                  "{}: label {} is neither a token id below the model's "
                                  "vocabulary size {} nor negative (no loss, e.g. "
                                  "-100); {}",
                                  where, bad->id, V, what_to_do)
                            : invalid_argument_error(
                                  "{}: token id {} is outside the model's vocabulary of "
                                  "{} ids (0 to {}); {}",
                                  where, bad->id, V, V - 1, what_to_do);
        return ids_error_;
    }
    ids_checked_.insert(prefix);
    return docs;
}

Status Trainer::setup() {
    // Where to compute, first: a device that cannot run the model (train.device cuda without a
    // usable GPU or without CUDA attention) is refused before anything is read or written.
    LATHE_ASSIGN_OR_RETURN(device_, ComputeDevice::open(s_.device, "train.device"));
    device_.set_deterministic(s_.deterministic);
    if (fp8_run()) LATHE_RETURN_IF_ERROR(check_fp8_device());
    if (device_.backend() == Backend::kCuda) {
        const GpuEnvironment env = gpu_environment_probe(device_.context().device);
        if (!env.devices.empty())
            peak_flops_ = bench_peak_flops(env.devices[0].cc_major, env.devices[0].cc_minor);
        flops_per_token_ = bench_flops_per_token(s_.model, s_.seq_len);
    }
    // The other ranks, when a launcher started several (run/world.h): the rendezvous is bounded
    // by parallel.timeout_s (or 5 minutes when that is off).
    const int rendezvous_ms = s_.timeout_s > 0 ? int(std::min(s_.timeout_s, 1e6) * 1000) : 300'000;
    // A model tensor parallel cannot split is refused before the other ranks are waited for.
    local_model_ = s_.model;
    if (tp() > 1) {
        const std::string& family = s_.model.model_type;
        if (family != "llama" && family != "mistral" && family != "qwen2") {
            return unimplemented_error(
                "{}: 'parallel.tensor' {}: the {} family has no tensor-parallel split (its "
                "attention projections are not sized by the heads); tensor parallel trains the "
                "llama, mistral and qwen2 families (set parallel.tensor 1)",
                config_.source_of("parallel.tensor"), tp(), family);
        }
        // The embedding and the LM head split by vocabulary rows (infer/tensor_parallel.h);
        // vocab_begin is set once the rank is known (setup_tensor_parallel).
        LATHE_ASSIGN_OR_RETURN(local_model_,
                               tp_local_config(s_.model, tp(),
                                               fmt::format("{}: 'parallel.tensor'",
                                                           config_.source_of("parallel.tensor")),
                                               TpVocab::kParallel));
    }
    LATHE_ASSIGN_OR_RETURN(world_, world_open(device_, rendezvous_ms));
    if (tp() > 1) LATHE_RETURN_IF_ERROR(setup_tensor_parallel());
    s_.world = dp_size();
    watchdog_ = std::make_unique<Watchdog>(
        multi() ? world_.comm.get() : nullptr,
        std::chrono::milliseconds(multi() ? int64_t(s_.timeout_s * 1000) : 0), world_.who());
    // One voice: ranks other than 0 report warnings and errors only.
    if (!lead() && log_level() < LogLevel::kWarning) log_set_level(LogLevel::kWarning);
    if (!s_.deterministic) log_info("train.deterministic false: runs may differ in the last bits");
    log_info("computing on {} in {}", device_.describe(), precision_text());
    if (fp8_run() && multi() && s_.fp8.recipe == Fp8Recipe::kDelayed) {
        // Each rank's casts see its own micro-batches: the amax histories would differ between
        // ranks, and a checkpoint holds one.
        return unimplemented_error(
            "'fp8.recipe: delayed' with {} data-parallel ranks: the amax histories are per "
            "rank (no reduction over the ranks in this build); use fp8.recipe: tensorwise, or "
            "one rank",
            world_.size());
    }
    if (dp_size() > 1) {
        log_info(
            "data parallel over {} ranks ({}), ZeRO-{}: each rank {} x {} micro-batches of "
            "the global batch of {}",
            dp_size(), launcher_name(world_.group.launcher), s_.zero_stage, s_.grad_accum,
            s_.micro_batch, s_.global_batch());
    }
    if (tp() > 1) {
        log_info(
            "tensor parallel over groups of {} consecutive ranks: each holds {} of {} heads, "
            "{} of {} key/value heads and {} of {} MLP columns{}",
            tp(), local_model_.num_heads, s_.model.num_heads, local_model_.num_kv_heads,
            s_.model.num_kv_heads, local_model_.intermediate_size, s_.model.intermediate_size,
            sequence_parallel() ? fmt::format(", and 1/{} of the residual stream's rows "
                                              "(sequence parallel)",
                                              tp())
                                : "");
    }
    std::error_code ec;
    fs::create_directories(request_.run_dir, ec);
    if (ec) return io_error("{}: cannot create the run folder: {}", request_.run_dir, ec.message());
#ifdef _OPENMP
    if (s_.threads > 0) omp_set_num_threads(s_.threads);
#endif
    // One trainer per run folder: rank 0 locks it (what `lathe runs` reads as "running") before
    // anything in it is written.
    Status locked = ok_status();
    if (lead()) {
        const std::string lock_path = (fs::path(request_.run_dir) / kRunLockFile).string();
        auto lock = FileLock::try_exclusive(
            lock_path, fmt::format("pid {} on host {}", ::getpid(), world_.host));
        if (lock.ok()) {
            run_lock_ = std::move(lock).value();
        } else {
            locked = lock.status().code() == StatusCode::kFailedPrecondition
                         ? failed_precondition_error(
                               "--run-dir {}: another lathe train is training this run ({}); "
                               "wait for it to end or stop it (SIGTERM saves a checkpoint), "
                               "or train into another --run-dir",
                               request_.run_dir, lock.status().message())
                         : lock.status();
        }
    }
    LATHE_RETURN_IF_ERROR(agree(locked, "rank 0 locking the run folder"));
    // Only now, with the run locked, is the configuration compared with the newest checkpoint's
    // (another trainer of the run could be publishing one).
    LATHE_RETURN_IF_ERROR(
        check_resume_config(request_.run_dir, config_.schema(), config_, dp_size()));
    LATHE_RETURN_IF_ERROR(check_ranks_agree(/*data=*/false));
    // The model and its memory plan, checked against the device before anything is allocated
    // or built (the data's index caches grow with the batch).
    ModelShape shape;
    shape.batch = s_.micro_batch;
    shape.seq_len = s_.seq_len;
    shape.backend = device_.backend();
    shape.recompute = s_.recompute;
    data_parallel_shape(shape, multi() ? dp_size() : 1, s_.zero_stage, multi() ? dp_rank() : 0);
    shape.communication_bytes = world_.device_bytes;
    const bool offload = s_.offload.offload == OptimizerOffload::kCpu;
    if (offload && multi()) {
        return unimplemented_error(
            "{}: 'optimizer.offload: cpu' runs in one process; a run of {} ranks keeps its "
            "optimizer on the devices (remove the key or launch one rank)",
            config_.source_of("optimizer.offload"), world_.size());
    }
    shape.masters_on_host = offload;
    shape.offload_fraction = s_.offload.fraction;
    shape.optimizer_state = s_.offload.state_dtype;
    if (fp8_run()) {
        shape.precision = fp8_precision_policy(s_.fp8);
        shape.fp8 = s_.fp8;
    }
    if (sequence_parallel()) {
        // Each tensor rank keeps an equal share of the residual stream's rows (model/block.h).
        if ((s_.micro_batch * s_.seq_len) % tp() != 0) {
            return invalid_argument_error(
                "{}: 'parallel.sequence_parallel' true: each of the {} tensor ranks "
                "('parallel.tensor') keeps an equal share of the micro-batch's rows, but "
                "train.micro_batch_size {} x data.seq_length {} = {} is not a multiple of {}; "
                "choose a micro_batch_size or seq_length whose product is, or set "
                "parallel.sequence_parallel: false",
                config_.source_of("parallel.sequence_parallel"), tp(), s_.micro_batch, s_.seq_len,
                s_.micro_batch * s_.seq_len, tp());
        }
        // With overlap the rows move in chunks, each cut over the ranks (model/block.h).
        const int64_t chunks = overlap_chunks();
        if ((s_.micro_batch * s_.seq_len) % (tp() * chunks) != 0) {
            return invalid_argument_error(
                "{}: 'parallel.tensor_overlap_chunks' {}: the micro-batch's rows move in {} "
                "chunks, each cut over the {} tensor ranks ('parallel.tensor'), but "
                "train.micro_batch_size {} x "
                "data.seq_length {} = {} is not a multiple of {} x {}; choose a product that "
                "is, fewer chunks, or parallel.tensor_overlap: false",
                config_.source_of("parallel.tensor_overlap_chunks"), chunks, chunks, tp(),
                s_.micro_batch, s_.seq_len, s_.micro_batch * s_.seq_len, tp(), chunks);
        }
        shape.sequence_shards = tp();
    }
    const ParamTable table = model_param_table(local_model_);
    auto plan = memory_plan_make(local_model_, table, shape);
    if (!plan.ok()) return plan.status();
    const size_t need = plan->total_bytes();
    const size_t have = device_.available_memory_bytes();
    if (have > 0 && need > have) {
        return invalid_argument_error(
            "train.micro_batch_size {} x data.seq_length {} needs {} of memory, "
            "{} has {} free; lower train.micro_batch_size (and raise "
            "train.gradient_accumulation_steps to keep the batch)",
            s_.micro_batch, s_.seq_len, format_bytes(need), device_.describe(), format_bytes(have));
    }
    // GPT-NeoX sizes the sample index by the global batch (every rank's micro-batches of a
    // step), so that the samples a run sees do not depend on how many ranks share them.
    s_.data.train_batch_size = s_.global_batch();
    // Data (GPT-NeoX's index building; caches beside the token files): rank 0 builds the caches,
    // the others read them once it has (and stop with it when it could not).
    auto build = [this]() -> Result<GptNeoxDatasets> {
        auto data = gpt_neox_build_datasets(
            s_.data, [this](const std::string& prefix) { return open_checked(prefix); });
        if (!data.ok()) return ids_error_.ok() ? data.status().with_context("data") : ids_error_;
        return data;
    };
    Result<GptNeoxDatasets> data = invalid_argument_error("data: not built");
    if (lead()) data = build();
    LATHE_RETURN_IF_ERROR(
        agree(lead() ? data.status() : ok_status(), "rank 0 building the data index caches"));
    if (!lead()) data = build();
    LATHE_RETURN_IF_ERROR(agree(data.status(), "opening the data"));
    data_ = std::move(data).value();
    LATHE_RETURN_IF_ERROR(check_ranks_agree(/*data=*/true));
    if (data_.train() == nullptr) {
        return invalid_argument_error(
            "data.path: the training split has no documents (data.split '{}')", s_.data.split);
    }
    if (s_.eval_interval > 0 && s_.eval_iters > 0 && data_.valid() == nullptr) {
        log_warning("the validation split is empty (data.split '{}'); validation is off",
                    s_.data.split);
        s_.eval_interval = 0;
    }
    auto model = Model::create(local_model_, shape, device_.context());
    if (!model.ok()) return model.status();
    model_.emplace(std::move(model).value());
    if (tp() > 1) {
        // The row-parallel outputs and the norm-output gradients, summed over the group in
        // stream order (model/block.h); a failure stops the step that called it.
        model_->set_tensor_parallel_sum([this](TensorView v) {
            if (!tp_error_.ok()) return;
            tp_error_ = tp_comm_->all_reduce(v, v, ReduceOp::kSum, device_.context().stream);
        });
        // The vocabulary-parallel LM head's row maxima (ops/vocab_parallel.h).
        model_->set_tensor_parallel_max([this](TensorView v) {
            if (!tp_error_.ok()) return;
            tp_error_ = tp_comm_->all_reduce(v, v, ReduceOp::kMax, device_.context().stream);
        });
    }
    if (sequence_parallel()) {
        // The residual stream's rows to full rows before each tensor-parallel region, and the
        // partial sums after it reduced to the rank's rows (model/block.h).
        // parallel.tensor_overlap: on their own stream beside the GEMMs, the forward in row
        // chunks (model/block.h, "Overlap").
        const int sms = device_.backend() == Backend::kCuda && device_.context().cuda != nullptr
                            ? device_.context().cuda->sm_count()
                            : 0;
        if (s_.tensor_overlap && sms > 0 && s_.tensor_overlap_sms >= sms) {
            return invalid_argument_error(
                "{}: 'parallel.tensor_overlap_sms' {} leaves no SM of {}'s {} to the GEMMs; "
                "choose fewer (0: none reserved)",
                config_.source_of("parallel.tensor_overlap_sms"), s_.tensor_overlap_sms,
                device_.describe(), sms);
        }
        tp_rows_.emplace(*tp_comm_, device_.context(), overlap_chunks(), s_.tensor_overlap,
                         &tp_error_, s_.tensor_overlap_sms);
        model_->set_tensor_parallel_rows(tp_rows_->rows());
    }
    const int64_t max_len = s_.model.hf.max_position_embeddings;
    LATHE_ASSIGN_OR_RETURN(tokenizer_files_, carried_tokenizer_files(s_.tokenizer_path, max_len));
    // The plan as allocated (on CUDA it now counts the attention workspaces cuDNN asked for);
    // with several ranks it is each rank's.
    if (lead()) {
        std::string title = model_config_summary(s_.model);
        if (multi())
            title += fmt::format(", per rank of {} (ZeRO-{}{})", world_.size(), s_.zero_stage,
                                 tp() > 1 ? fmt::format(", tensor parallel {}", tp()) : "");
        std::string table = model_->plan().table(title);
        if (offload) {
            LATHE_ASSIGN_OR_RETURN(
                const HostMemoryPlan host,
                host_memory_plan(model_->params_total(), model_->plan().offload_begin, s_.offload));
            table += fmt::format(
                "{}  moments in {} (optimizer.state_dtype), stepped by CpuAdamW, {} schedule{}\n",
                host.to_string(), adamw_state_dtype_name(s_.offload.state_dtype),
                offload_schedule_name(s_.offload.schedule),
                s_.offload.schedule == OffloadSchedule::kDelayed
                    ? " (each step computes with the weights before the last update)"
                    : "");
        }
        if (print_lines()) std::fputs(table.c_str(), stderr);
        LATHE_RETURN_IF_ERROR(
            file_write_atomic((fs::path(request_.run_dir) / kMemoryPlanFile).string(), table));
    }
    if (offload) {
        // The pinned host bytes checked against what the host has, before they are allocated.
        LATHE_ASSIGN_OR_RETURN(
            const HostMemoryPlan host,
            host_memory_plan(model_->params_total(), model_->plan().offload_begin, s_.offload));
        LATHE_ASSIGN_OR_RETURN(const HostMemoryAvailable avail, host_memory_available());
        LATHE_RETURN_IF_ERROR(host_memory_check(host, avail));
        LATHE_ASSIGN_OR_RETURN(HostOptimizer host_optimizer,
                               HostOptimizer::create_for(*model_, s_.offload.state_dtype,
                                                         /*threads=*/0, s_.offload.schedule));
        host_optimizer_.emplace(std::move(host_optimizer));
    }
    std::vector<FlatRange> ranges{FlatRange{0, model_->params_total()}};
    if (multi()) {
        LATHE_ASSIGN_OR_RETURN(dp_, DataParallel::create(*model_, dp_comm(), s_.zero_stage));
        ranges = dp_->optimizer_ranges();
        // Tensor parallel: the entries every rank holds whole count once in the gradient norm
        // (tensor rank 0's), the shards once each (summed over the group by TrainStep).
        if (tp_rank() != 0) dp_->exclude_from_norm(tp_replicated_ranges(*model_));
    }
    if (!offload) {
        LATHE_ASSIGN_OR_RETURN(
            AdamWOptimizer optimizer,
            AdamWOptimizer::create_for(*model_, ranges, model_->context(), s_.offload.state_dtype));
        optimizer_.emplace(std::move(optimizer));
    }

    // Frozen parameter groups (train.freeze): an entry is frozen when its name, or every HF
    // tensor stored in it, matches a pattern.
    const ParamTable& params = model_->params();
    frozen_.assign(params.entries().size(), 0);
    for (const std::string& pattern : s_.freeze) {
        bool matched_any = false;
        for (size_t e = 0; e < params.entries().size(); ++e) {
            int hf_total = 0, hf_matched = 0;
            for (const HfParam& hp : params.hf_params()) {
                if (hp.entry != e) continue;
                ++hf_total;
                hf_matched += glob_match(pattern, hp.name) ? 1 : 0;
            }
            const bool whole = glob_match(pattern, params.entries()[e].name) ||
                               (hf_total > 0 && hf_matched == hf_total);
            if (!whole && hf_matched > 0) {
                return invalid_argument_error(
                    "train.freeze: '{}' matches only some of the tensors stored together in "
                    "'{}' (e.g. q/k/v); freeze all of them or none",
                    pattern, params.entries()[e].name);
            }
            if (whole) {
                frozen_[e] = 1;
                matched_any = true;
            }
        }
        if (!matched_any) {
            return invalid_argument_error(
                "train.freeze: '{}' matches no parameter (names are Hugging Face's, "
                "e.g. '{}')",
                pattern, params.hf_params().front().name);
        }
    }
    if (tp_rank() != 0) {
        // The biases of the row-parallel projections live on tensor rank 0 (zeros elsewhere,
        // infer/tensor_parallel.h): the other ranks neither train them nor count their norm.
        for (size_t e = 0; e < params.entries().size(); ++e)
            if (tp_split_of(params.entries()[e].role) == TpSplit::kRankZero) frozen_[e] = 1;
    }
    if (optimizer_ && s_.schedule == OptimizerSchedule::kOverlapped) {
        if (multi())
            return invalid_argument_error(
                "{}: 'optimizer.schedule: overlapped' runs in one process; a world of {} ranks "
                "keeps the serial schedule: set optimizer.schedule: serial",
                config_.source_of("optimizer.schedule"), world_.size());
        LATHE_RETURN_IF_ERROR(optimizer_->overlap_with(*model_, s_.optimizer_sms)
                                  .with_context(config_.source_of("optimizer.schedule") +
                                                ": 'optimizer.schedule: overlapped'"));
    }
    if (host_optimizer_)
        step_.emplace(*model_, *host_optimizer_, frozen_);
    else
        step_.emplace(*model_, *optimizer_, frozen_, dp_.get(), tp_comm_.get());
    // Rank 0 opens the checkpoints folder (cleaning what a killed run left half-written); the
    // others attach to it once it has.
    const std::string root = (fs::path(request_.run_dir) / "checkpoints").string();
    Status opened = ok_status();
    if (lead()) {
        opened = [&]() -> Status {
            LATHE_ASSIGN_OR_RETURN(CheckpointDir ckpt, CheckpointDir::open(root));
            ckpt_.emplace(std::move(ckpt));
            return file_write_atomic((fs::path(request_.run_dir) / "config.yaml").string(),
                                     config_.to_yaml());
        }();
    }
    LATHE_RETURN_IF_ERROR(agree(opened, "rank 0 opening the checkpoints folder"));
    if (!lead()) {
        LATHE_ASSIGN_OR_RETURN(CheckpointDir ckpt, CheckpointDir::attach(root));
        ckpt_.emplace(std::move(ckpt));
    }
    return ok_status();
}

Status Trainer::check_ranks_agree(bool data) {
    if (!multi()) return ok_status();
    auto guard = watchdog_->arm(data ? "the check that every rank reads the same data"
                                     : "the check that every rank runs the same binary and "
                                       "configuration");
    std::vector<RankItem> items;
    if (!data) {
        LATHE_ASSIGN_OR_RETURN(const uint64_t exe, file_content_hash("/proc/self/exe"));
        items.push_back({"the lathe binary", exe});
        // Every key but those a rank may set for itself (its GPU, its CPU threads).
        for (const ConfigKey& key : config_.schema().keys()) {
            if (key.name == "train.device" || key.name == "train.threads") continue;
            const std::string text = config_value_text(config_, key);
            items.push_back({key.name, hash_bytes(text.data(), text.size())});
        }
    } else {
        // The token files as each rank sees them: their index (.idx) bytes and the data (.bin)
        // sizes, and the sample count of each split.
        const GptNeoxDataArgs& d = s_.data;
        std::vector<std::string> prefixes = {d.data_path};
        for (const auto* list :
             {&d.train_data_paths, &d.valid_data_paths, &d.test_data_paths,
              &d.train_label_data_paths, &d.valid_label_data_paths, &d.test_label_data_paths})
            prefixes.insert(prefixes.end(), list->begin(), list->end());
        for (const std::string& prefix : prefixes) {
            if (prefix.empty()) continue;
            std::error_code ec;
            const uint64_t bin = fs::file_size(prefix + ".bin", ec);
            auto idx = file_content_hash(prefix + ".idx");
            items.push_back(
                {"data file " + prefix, (idx.ok() ? *idx : 0) * 31 + (ec ? uint64_t(-1) : bin)});
        }
        const SampleSource* splits[] = {data_.train(), data_.valid(), data_.test()};
        const char* names[] = {"training samples", "validation samples", "test samples"};
        for (int i = 0; i < 3; ++i)
            items.push_back({names[i], splits[i] ? uint64_t(splits[i]->size()) : 0});
    }
    return check_same_across_ranks(*world_.comm, items, device_.context().stream);
}

Status Trainer::agree(Status mine, std::string_view what) {
    if (!multi()) return mine;
    auto guard = watchdog_->arm(fmt::format("agreeing on {}", what));
    LATHE_ASSIGN_OR_RETURN(const int failed, all_reduce_max(*world_.comm, mine.ok() ? 0 : 1,
                                                            device_.context().stream));
    if (!mine.ok()) return mine;
    if (failed != 0) {
        return failed_precondition_error(
            "{}: another rank failed at {} (its error is above or in the launcher's output); "
            "stopping with it",
            world_.who(), what);
    }
    return ok_status();
}

Status Trainer::load_checkpoint(const std::string& dir, bool with_optimizer_and_state) {
    if (tp() > 1) {
        // Any checkpoint of the model (one Hugging Face folder at every layout): this rank's shard.
        LATHE_RETURN_IF_ERROR(tp_model_load(*model_, tp_rank(), tp(), dir));
    } else {
        auto ck = SafetensorsCheckpoint::open(dir);
        if (!ck.ok()) return ck.status().with_context(dir);
        LATHE_RETURN_IF_ERROR(model_load_hf(*model_, *ck));
    }
    if (!with_optimizer_and_state) return ok_status();
    // The optimizer state is written per tensor rank: a checkpoint of another parallel.tensor is
    // converted, each HF tensor's moments assembled from its ranks and sliced for this one.
    int64_t written_tp = 1;
    bool vocabulary_split = false;
    {
        const std::string state_path = (fs::path(dir) / kTrainerStateFile).string();
        if (auto text = file_read_all(state_path); text.ok()) {
            const auto j = json_parse<nlohmann::json>(*text);
            if (j.is_object() && j.contains("tensor_parallel") &&
                j.at("tensor_parallel").is_number_integer())
                written_tp = j.at("tensor_parallel").get<int64_t>();
            vocabulary_split = j.is_object() && j.contains("tensor_parallel_vocabulary") &&
                               j.at("tensor_parallel_vocabulary").is_string() &&
                               j.at("tensor_parallel_vocabulary").get<std::string>() == "split";
        }
    }
    if (written_tp > 1 && !vocabulary_split) {
        // Its moments hold the whole embedding and head on every tensor rank: read as this
        // build's split layout they would land on the wrong entries.
        return failed_precondition_error(
            "{}: the checkpoint's optimizer state was written at parallel.tensor {} with the whole "
            "vocabulary on every tensor rank (its {} has no \"tensor_parallel_vocabulary\": "
            "\"split\"); lathe splits the embedding and the LM head by vocabulary rows. Start a "
            "new --run-dir from its weights (checkpoint.init_from: {}, which any layout loads)",
            dir, written_tp, kTrainerStateFile, dir);
    }
    if (written_tp != tp()) {
        const Result<ModelConfig> before = tp_local_config(
            s_.model, int(std::clamp<int64_t>(written_tp, 0, 1 << 20)),
            fmt::format("{}: tensor_parallel", kTrainerStateFile), TpVocab::kParallel);
        if (!before.ok() || host_optimizer_) {
            return failed_precondition_error(
                "{}: the checkpoint was written at parallel.tensor {}, this run has "
                "parallel.tensor {}{}. Resume with parallel.tensor {}, or start a new --run-dir "
                "from its weights (checkpoint.init_from: {}, which any layout loads)",
                dir, written_tp, tp(),
                host_optimizer_ ? " and optimizer.offload cpu, which reads its own layout only"
                                : fmt::format(" ({})", before.status().message()),
                written_tp, dir);
        }
        log_info("converting the optimizer state of parallel.tensor {} to {}", written_tp, tp());
        const int from = int(written_tp);
        const int64_t used_before = tp_canonical_length(s_.model, from, TpVocab::kParallel);
        std::vector<std::vector<float>> old_m(static_cast<size_t>(from)),
            old_v(static_cast<size_t>(from));
        for (int r = 0; r < from; ++r) {
            const std::string folder =
                from == 1 ? dir
                          : (fs::path(dir) / fmt::format("tensor-rank-{:05d}-of-{:05d}", r, from))
                                .string();
            old_m[size_t(r)].resize(size_t(used_before));
            old_v[size_t(r)].resize(size_t(used_before));
            const FlatRange all{0, used_before};
            LATHE_RETURN_IF_ERROR(optimizer_state_load_ranges(folder, used_before,
                                                              std::span<const FlatRange>(&all, 1),
                                                              old_m[size_t(r)], old_v[size_t(r)]));
        }
        std::vector<float> m =
            tp_reshard_moments(s_.model, from, old_m, tp(), tp_rank(), TpVocab::kParallel);
        std::vector<float> v =
            tp_reshard_moments(s_.model, from, old_v, tp(), tp_rank(), TpVocab::kParallel);
        if (dp_) {
            dp_->load_optimizer_canonical(*optimizer_, m, v);
        } else {
            // One process: its arena is the canonical vector, zero padded at its end.
            m.resize(size_t(optimizer_->numel()), 0.0f);
            v.resize(size_t(optimizer_->numel()), 0.0f);
            optimizer_->write_state(m, v);
        }
    } else if (dp_) {
        // Whatever world wrote it: one file, or one per rank, re-sharded onto this rank's ranges.
        LATHE_RETURN_IF_ERROR(dp_->load_optimizer(*optimizer_, optimizer_dir(dir)));
    } else if (host_optimizer_) {
        LATHE_RETURN_IF_ERROR(host_optimizer_->load_state(
            dir, int64_t(model_->params().layout().total_bytes() / sizeof(float))));
    } else {
        LATHE_RETURN_IF_ERROR(optimizer_state_load_checkpoint(
            *optimizer_, dir, int64_t(model_->params().layout().total_bytes() / sizeof(float))));
    }
    const std::string state_path = (fs::path(dir) / kTrainerStateFile).string();
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(state_path));
    const auto j = json_parse<nlohmann::json>(text);
    if (j.is_discarded()) return data_loss_error("{}: not valid JSON", state_path);
    LATHE_ASSIGN_OR_RETURN(st_, trainer_state_from_json(j, state_path));
    if (Fp8ScalingState* scaling = model_->fp8_scaling()) {
        // Delayed fp8 scaling: the histories and scales the checkpoint's run reached, so that
        // the next step casts with the same scales, bit for bit.
        const std::string path = (fs::path(dir) / kFp8ScalingFile).string();
        if (file_exists(path)) {
            LATHE_RETURN_IF_ERROR(scaling->load(path));
            model_->fp8_upload_scales();
        } else {
            log_warning(
                "{}: no {} (a checkpoint of a run without delayed fp8 scaling): the amax "
                "histories start empty",
                dir, kFp8ScalingFile);
        }
    }
    return ok_status();
}

Status Trainer::init_or_resume() {
    LATHE_ASSIGN_OR_RETURN(std::optional<std::string> newest, ckpt_->newest());
    if (newest) {
        log_info("resuming from {}", *newest);
        if (Status loaded = load_checkpoint(*newest, true); !loaded.ok())
            return with_resume_advice(loaded, *ckpt_, *newest);
        if (lead()) {
            LATHE_ASSIGN_OR_RETURN(
                metrics_, MetricsLog::open((fs::path(request_.run_dir) / "metrics.jsonl").string(),
                                           st_.step));
        }
        return ok_status();
    }
    if (!s_.init_from.empty()) {
        const bool cont = s_.init_mode == InitMode::kContinue;
        log_info("initialising from {} ({})", s_.init_from, cont ? "continue" : "finetune");
        LATHE_RETURN_IF_ERROR(load_checkpoint(s_.init_from, cont));
    } else {
        log_info("initialising from seed {}", s_.seed);
        if (tp() > 1)
            tp_model_init(*model_, s_.model, tp_rank(), tp(), s_.seed);  // TP=1's weights
        else
            model_->init(s_.seed);
    }
    if (lead()) {
        LATHE_ASSIGN_OR_RETURN(
            metrics_,
            MetricsLog::open((fs::path(request_.run_dir) / "metrics.jsonl").string(), -1));
        if (fp8_run()) {
            // The header of an fp8 run: the precision its linears compute in (step 0: kept by a
            // resume, which cuts the file back to the checkpoint's step).
            LATHE_RETURN_IF_ERROR(
                metrics_.write({{"step", int64_t(0)},
                                {"split", std::string("header")},
                                {"precision", std::string("fp8")},
                                {"fp8_recipe", std::string(fp8_recipe_name(s_.fp8.recipe))},
                                {"fp8_grad_format", std::string(dtype_name(s_.fp8.grad_dtype))},
                                {"fp8_lm_head", std::string(s_.fp8.lm_head ? "fp8" : "bf16")},
                                {"fp8_gemms_per_step",
                                 fp8_gemms_per_step(s_.model.num_layers, s_.fp8, s_.grad_accum,
                                                    s_.recompute == Recompute::kFull)}}));
        }
    }
    return ok_status();
}

std::string Trainer::precision_text() const {
    if (device_.backend() != Backend::kCuda) return "fp32";
    if (!fp8_run()) return "bf16";
    return fmt::format(
        "fp8 (recipe {}{}, weights and activations e4m3, gradients {}, LM head {}; attention, "
        "norms and embeddings bf16)",
        fp8_recipe_name(s_.fp8.recipe),
        s_.fp8.recipe == Fp8Recipe::kDelayed
            ? fmt::format(": amax history {}, {}", s_.fp8.amax_history,
                          fp8_amax_reduction_name(s_.fp8.amax_reduction))
            : std::string(),
        dtype_name(s_.fp8.grad_dtype), s_.fp8.lm_head ? "fp8" : "bf16");
}

Status Trainer::check_fp8_device() {
    if (device_.backend() != Backend::kCuda) {
        return failed_precondition_error(
            "'train.precision: fp8': train.device {} computes on {}, the {} backend, which has "
            "no fp8 linear; fp8 trains on a GPU with FP8 tensor cores (compute capability 8.9 "
            "or newer: Ada, Hopper); train with train.precision fp32 here, or on such a GPU",
            s_.device, device_.describe(), backend_name(device_.backend()));
    }
    const int device = device_.context().device;
    const std::string problem = cuda::fp8_support_problem(device);
    if (!problem.empty()) {
        return failed_precondition_error(
            "'train.precision: fp8': {}; train in bf16 on it, or on a GPU with FP8 tensor cores",
            problem);
    }
    bool ok = false;
    const std::string line = cuda::fp8_self_test(device, ok);
    if (!ok) {
        return internal_error(
            "'train.precision: fp8': the FP8 self-test failed before step 1 ({}); `lathe "
            "doctor` shows it too: train in bf16 until it passes",
            line);
    }
    log_debug("{}", line);
    return ok_status();
}

Status Trainer::open_tensorboard() {
    if (!s_.tensorboard) return ok_status();
    LATHE_ASSIGN_OR_RETURN(
        TensorBoardWriter w,
        TensorBoardWriter::open((fs::path(request_.run_dir) / "tb").string(), st_.step + 1));
    tb_.emplace(std::move(w));
    return ok_status();
}

Status Trainer::setup_tensor_parallel() {
    const std::string key =
        fmt::format("{}: 'parallel.tensor'", config_.source_of("parallel.tensor"));
    if (world_.size() % tp() != 0) {
        return invalid_argument_error(
            "{} {} must divide the number of ranks ({}): the world is tensor x data-parallel "
            "ranks; launch a multiple of {} ranks",
            key, tp(), world_.size(), tp());
    }
    if (s_.offload.offload == OptimizerOffload::kCpu) {
        return unimplemented_error(
            "{}: 'optimizer.offload: cpu' runs in one process; tensor parallel keeps its "
            "optimizer on the devices (remove the key, or set parallel.tensor 1)",
            config_.source_of("optimizer.offload"));
    }
    if (fp8_run()) {
        return unimplemented_error(
            "{} {}: train.precision fp8 runs without tensor parallel (set "
            "parallel.tensor 1, or train.precision bf16)",
            key, tp());
    }
    const int rank = world_.rank();
    // Consecutive ranks share a tensor-parallel group (inside a node); the ranks of one tensor
    // rank form a data-parallel group.
    LATHE_ASSIGN_OR_RETURN(tp_comm_, world_.comm->split(rank / tp(), rank));
    LATHE_ASSIGN_OR_RETURN(dp_comm_, world_.comm->split(rank % tp(), rank));
    local_model_.vocab_begin = int64_t(tp_rank()) * local_model_.vocab_size;
    return ok_status();
}

std::string Trainer::optimizer_dir(const std::string& dir) const {
    if (tp() == 1) return dir;
    return (fs::path(dir) / fmt::format("tensor-rank-{:05d}-of-{:05d}", tp_rank(), tp())).string();
}

Status Trainer::save_checkpoint() {
    // Rank 0 begins the step's folder, every rank writes its part into it (ZeRO-1: its optimizer
    // shard; the gathered model and the rest come from rank 0), and rank 0 publishes it once every
    // rank said its files are complete: a checkpoint with a rank's part missing is never published.
    std::string dir;
    Status begun = ok_status();
    if (lead()) {
        Result<std::string> d = ckpt_->begin(st_.step);
        if (d.ok()) dir = *d;
        begun = d.status();
    }
    LATHE_RETURN_IF_ERROR(agree(begun, "rank 0 starting the checkpoint folder"));
    if (!lead()) dir = ckpt_->partial_path(st_.step);
    const Status written = [&]() -> Status {
        // Offload, overlapped or delayed: the update in flight reaches the masters the files are
        // read from (and, delayed, the weights the next step computes with).
        if (host_optimizer_) host_optimizer_->finish();
        // Overlapped device update: the pending units reach the weights and moments first.
        if (optimizer_) optimizer_->finish();
        if (dp_) {
            auto guard = watchdog_->arm("the gather of the parameters for the checkpoint");
            LATHE_RETURN_IF_ERROR(dp_->gather_masters());
        }
        if (tp() > 1) {
            // One Hugging Face folder of the full model: the ranks of data-parallel rank 0 (the
            // first tensor-parallel group) gather their shards to rank 0, which writes it.
            auto guard = watchdog_->arm("the gather of the parameters for the checkpoint");
            const bool first_group = dp_rank() == 0;
            ParamStaging staging(*model_);
            if (dp_ && dp_->params_sharded())
                LATHE_RETURN_IF_ERROR(dp_->gather_params(first_group ? &staging : nullptr));
            else if (first_group)
                staging.download_all();
            if (first_group)
                LATHE_RETURN_IF_ERROR(
                    tp_save_hf(*model_, staging, s_.model, *tp_comm_, device_.context(), dir));
        } else if (dp_ && dp_->params_sharded()) {
            // ZeRO-3: every rank joins the gathers, rank 0 keeps the entries and writes them.
            auto guard = watchdog_->arm("the gather of the parameters for the checkpoint");
            ParamStaging staging(*model_);
            LATHE_RETURN_IF_ERROR(dp_->gather_params(lead() ? &staging : nullptr));
            if (lead()) LATHE_RETURN_IF_ERROR(model_save_hf_staged(*model_, staging, dir));
        } else if (lead()) {
            LATHE_RETURN_IF_ERROR(model_save_hf(*model_, dir));
        }
        if (lead()) {
            LATHE_RETURN_IF_ERROR(carried_files_write(tokenizer_files_, dir));
        }
        if (dp_) {
            const std::string odir = optimizer_dir(dir);
            if (odir != dir) {
                std::error_code ec;
                fs::create_directories(odir, ec);
                if (ec) return io_error("{}: cannot create the folder: {}", odir, ec.message());
            }
            LATHE_RETURN_IF_ERROR(dp_->save_optimizer(*optimizer_, odir));
        } else if (host_optimizer_) {
            LATHE_RETURN_IF_ERROR(
                host_optimizer_->save_state((fs::path(dir) / kOptimizerStateFile).string()));
        } else if (lead()) {
            LATHE_RETURN_IF_ERROR(
                optimizer_state_save(*optimizer_, (fs::path(dir) / kOptimizerStateFile).string()));
        }
        if (!lead()) return ok_status();
        if (const Fp8ScalingState* scaling = model_->fp8_scaling())
            LATHE_RETURN_IF_ERROR(scaling->save((fs::path(dir) / kFp8ScalingFile).string()));
        st_.consumed_train_samples = st_.step * s_.global_batch();
        st_.tokens = st_.step * s_.tokens_per_step();
        nlohmann::json j = trainer_state_to_json(st_);
        j["seed"] = s_.seed;
        j["config"] = config_.to_yaml();
        if (multi()) j["world_size"] = dp_size();
        if (tp() > 1) {
            j["tensor_parallel"] = tp();
            // The optimizer state's layout under tensor parallel: each rank's embedding and
            // head rows are its vocabulary shard (a resume checks it, see load).
            j["tensor_parallel_vocabulary"] = "split";
        }
        return file_write_atomic((fs::path(dir) / kTrainerStateFile).string(), j.dump(2) + "\n");
    }();
    LATHE_RETURN_IF_ERROR(agree(
        written, fmt::format("writing its part of the checkpoint of step {} (the checkpoint is "
                             "not published; the previous one is intact)",
                             st_.step)));
    // Rank 0 publishes; every rank waits for it (a rank that exited first could have the job
    // ended, by mpirun or srun, while rank 0 is still publishing).
    Status published = ok_status();
    if (lead()) {
        published = [&]() -> Status {
            // Every rank's shard is in the folder rank 0 sees (a run folder that only looks
            // shared, e.g. node-local, is caught here, before the checkpoint is published).
            if (dp_ != nullptr) LATHE_RETURN_IF_ERROR(dp_->check_checkpoint(optimizer_dir(dir)));
            LATHE_ASSIGN_OR_RETURN(std::string final_dir, ckpt_->commit(st_.step, s_.keep_last));
            log_info("checkpoint {}", final_dir);
            return ok_status();
        }();
    }
    return agree(published, fmt::format("rank 0 publishing the checkpoint of step {}", st_.step));
}

Status Trainer::train_step(float& loss_out, float& norm_out, bool& skipped) {
    const int64_t B = s_.micro_batch, T = s_.seq_len, K = s_.grad_accum;
    // The micro-batches come from the loader thread (GPT-NeoX's order, read ahead); the step
    // enqueues each without waiting for the GPU and waits once, for the gradient norm.
    LATHE_ASSIGN_OR_RETURN(const TrainStepValues values,
                           step_->gradients(
                               K,
                               [&](int64_t k) -> Result<ModelBatch> {
                                   LATHE_ASSIGN_OR_RETURN(const BatchBuffers* buf,
                                                          loader_->next(st_.step * K + k));
                                   return batch_views(*buf, B, T);
                               },
                               [] { return g_stop_signal.load(); }));
    LATHE_RETURN_IF_ERROR(tp_error_.with_context("a tensor-parallel collective of a layer"));
    agreed_stop_ = values.stop_request;
    comm_wait_ms_ += values.comm_wait_ms;
    if (fp8_run()) {
        // The proof that the step ran its linears in fp8: the GEMMs the linear ops counted.
        const int64_t gemms = model_->fp8_take_gemms();
        const int64_t want =
            fp8_gemms_per_step(s_.model.num_layers, s_.fp8, K, s_.recompute == Recompute::kFull);
        if (gemms != want) {
            return internal_error(
                "step {}: the linear ops ran {} FP8 GEMMs, where fp8_gemms_per_step predicts {} "
                "({} layers, {} micro-batches): a bug in lathe's fp8 wiring; train in bf16 and "
                "report it",
                st_.step + 1, gemms, want, s_.model.num_layers, K);
        }
        last_fp8_gemms_ = gemms;
    }
    ++comm_steps_;
    const float loss = values.loss, norm = values.norm;
    loss_out = loss;
    norm_out = norm;

    const bool nonfinite = !std::isfinite(loss) || !std::isfinite(norm);
    const bool spike =
        s_.spike_factor > 0.0 && st_.loss_count >= 10 && loss > s_.spike_factor * st_.loss_mean;
    if (nonfinite || spike) {
        const std::string what =
            nonfinite ? fmt::format("a non-finite {} (loss {}, grad norm {})",
                                    !std::isfinite(loss) ? "loss" : "gradient", loss, norm)
                      : fmt::format("a loss spike ({:.4f} > {} x running mean {:.4f})", loss,
                                    s_.spike_factor, st_.loss_mean);
        if (s_.nonfinite == NonfinitePolicy::kStop) {
            return failed_precondition_error(
                "step {}: {}; stopping (train.nonfinite_policy: stop). The last "
                "checkpoint is intact; lower optimizer.lr or set the policy to skip",
                st_.step + 1, what);
        }
        ++st_.skipped_steps;
        ++st_.skipped_in_a_row;
        clear_bar();
        log_warning("step {}: {}; step skipped ({} in a row, {} in all)", st_.step + 1, what,
                    st_.skipped_in_a_row, st_.skipped_steps);
        if (s_.max_skipped > 0 && st_.skipped_in_a_row > s_.max_skipped) {
            return failed_precondition_error(
                "{} steps in a row were skipped (train.max_skipped_steps {}); the run "
                "is diverging: lower optimizer.lr or check the data",
                st_.skipped_in_a_row, s_.max_skipped);
        }
        skipped = true;
        return ok_status();
    }
    skipped = false;
    st_.skipped_in_a_row = 0;

    ++st_.adam_step;
    LATHE_RETURN_IF_ERROR(step_->apply(s_.lr.lr_at(st_.step), s_.weight_decay, s_.adam,
                                       st_.adam_step, float(s_.grad_clip)));  // clips when > 0
    st_.loss_count += 1;
    st_.loss_mean +=
        (double(loss) - st_.loss_mean) / double(std::min<int64_t>(st_.loss_count, 100));
    return ok_status();
}

Status Trainer::evaluate(double& loss_out) {
    const int64_t B = s_.micro_batch, T = s_.seq_len, n = s_.eval_iters;
    // The weights of the steps so far: the delayed offload schedule's update in flight reaches
    // them first (optim/host_optimizer.h); the overlapped one's forward waits for it per unit.
    if (host_optimizer_ && host_optimizer_->schedule() == OffloadSchedule::kDelayed)
        host_optimizer_->finish();
    // Data parallel: rank r evaluates micro-batches r, r + W, ...; the losses are gathered and
    // summed in micro-batch order, as one process sums them.
    const int64_t W = dp_size(), per_rank = (n + W - 1) / W;
    std::vector<float> mine(size_t(per_rank), 0.0f);
    // ZeRO-3: every forward gathers the layers with the other ranks, so every rank runs
    // per_rank of them; one past the last micro-batch evaluates micro-batch i % n again and
    // drops its loss.
    const bool every_rank_forwards = dp_ != nullptr && dp_->params_sharded();
    for (int64_t j = 0; j < per_rank; ++j) {
        const int64_t i = j * W + dp_rank();
        if (i >= n && !every_rank_forwards) break;
        // GPT-NeoX keeps one validation iterator across passes: pass p reads micro-batches
        // p * eval_iters + i.
        LATHE_ASSIGN_OR_RETURN(const int64_t first,
                               gpt_neox_micro_batch_start(st_.eval_passes * n + i % n, B, 1, 0,
                                                          data_.valid()->size()));
        LATHE_RETURN_IF_ERROR(
            fill_batch(*data_.valid(), first, B, T, s_.per_document_attention, buf_));
        // No training step's: with delayed fp8 scaling, the validation batches' amaxes join no
        // step's history (model.h, "FP8 linears"), so eval_interval leaves the training as it is.
        // The forward's collectives (ZeRO-3's gathers, the tensor-parallel sums) under the
        // watchdog, as a training step's are: a peer that failed or stopped ends the run within
        // parallel.timeout_s instead of leaving this rank waiting.
        auto guard = watchdog_->arm(fmt::format(
            "validation micro-batch {} (its collectives with the other ranks)", i % n + 1));
        const float loss = model_->eval_forward(batch_views(buf_, B, T));
        LATHE_RETURN_IF_ERROR(tp_error_.with_context("a tensor-parallel collective of a layer"));
        if (i < n) mine[size_t(j)] = loss;
    }
    std::vector<float> all = mine;
    if (multi()) {
        auto guard = watchdog_->arm("the gather of the validation losses");
        all.resize(size_t(W * per_rank));
        LATHE_RETURN_IF_ERROR(
            all_gather_bytes(dp_comm(), std::as_bytes(std::span<const float>(mine)),
                             std::as_writable_bytes(std::span<float>(all)), dp_->stream())
                .with_context("gathering the validation losses"));
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(all[size_t((i % W) * per_rank + i / W)]);
    ++st_.eval_passes;
    model_->fp8_take_gemms();  // the forwards' FP8 GEMMs are no step's
    loss_out = sum / double(n);
    return ok_status();
}

Status Trainer::run() {
    // Whatever ends the run (an error included: main prints it next), the progress line goes.
    struct ClearBarOnExit {
        Trainer* t;
        ~ClearBarOnExit() { t->clear_bar(); }
    } clear_bar_on_exit{this};
    LATHE_RETURN_IF_ERROR(setup());
    LATHE_RETURN_IF_ERROR(agree(init_or_resume(), "loading the checkpoint or initialising"));
    if (multi()) {
        // Every rank resumed from the same checkpoint (a file system whose listings differ between
        // nodes would make them start at different steps and call different collectives).
        auto guard = watchdog_->arm("the check that every rank resumed from the same step");
        const RankItem items[] = {{"resumed step", uint64_t(st_.step)},
                                  {"resumed optimizer step", uint64_t(st_.adam_step)},
                                  {"resumed validation passes", uint64_t(st_.eval_passes)}};
        LATHE_RETURN_IF_ERROR(
            check_same_across_ranks(*world_.comm, items, device_.context().stream));
    }
    if (st_.step >= s_.steps) {
        log_info("the run is complete ({} of {} steps); nothing to do", st_.step, s_.steps);
        return ok_status();
    }
    if (lead()) LATHE_RETURN_IF_ERROR(open_tensorboard());
    StopSignals signals;
    log_info(
        "training {} -> step {}: {} tokens per step (B {} x T {} x accumulation {}{}), {} "
        "parameters, "
        "{} threads",
        st_.step, s_.steps, s_.tokens_per_step(), s_.micro_batch, s_.seq_len, s_.grad_accum,
        multi() ? (tp() > 1 ? fmt::format(" x {} data-parallel ranks, each a group of {}",
                                          dp_size(), tp())
                            : fmt::format(" x {} ranks", world_.size()))
                : std::string(),
        model_->params().num_elements(),
#ifdef _OPENMP
        omp_get_max_threads()
#else
        1
#endif
    );
    const int64_t K = s_.grad_accum;
    loader_.emplace(*data_.train(), st_.step * K, s_.steps * K, s_.micro_batch, s_.seq_len,
                    s_.per_document_attention, /*depth=*/2, dp_size(), dp_rank());
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t first_step = st_.step;
    while (st_.step < s_.steps) {
        float loss = 0.0f, norm = 0.0f;
        bool skipped = false;
        {
            // The step's gradient reduction, loss gather and (ZeRO-1) parameter gather.
            auto guard = watchdog_->arm(
                fmt::format("step {} (its collectives with the other ranks)", st_.step + 1));
            LATHE_RETURN_IF_ERROR(train_step(loss, norm, skipped));
        }
        ++st_.step;
        if (!skipped) {
            st_.interval_loss_sum += loss;
            st_.interval_steps += 1;
            last_norm_ = norm;
        }
        const double elapsed =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (st_.step % s_.log_interval == 0 || st_.step == s_.steps) {
            clear_bar();
            LATHE_RETURN_IF_ERROR(log_line(elapsed, st_.step - first_step));
        }
        if (s_.eval_interval > 0 && s_.eval_iters > 0 &&
            (st_.step % s_.eval_interval == 0 || st_.step == s_.steps)) {
            double vloss = 0.0;
            LATHE_RETURN_IF_ERROR(evaluate(vloss));
            if (lead() && print_lines()) {
                clear_bar();
                std::fprintf(stderr, "step %lld/%lld | validation loss %.4f | perplexity %.2f\n",
                             (long long)st_.step, (long long)s_.steps, vloss, std::exp(vloss));
            }
            if (lead()) {
                LATHE_RETURN_IF_ERROR(
                    metrics_.write({{"step", st_.step},
                                    {"split", std::string("valid")},
                                    {"loss", vloss},
                                    {"perplexity", std::exp(vloss)},
                                    {"tokens", st_.step * s_.tokens_per_step()}}));
                if (tb_)
                    LATHE_RETURN_IF_ERROR(tb_->write_scalars(
                        st_.step, {{"valid/loss", float(vloss)},
                                   {"valid/perplexity", float(std::exp(vloss))}}));
            }
        }
        // A signal after the last step stops nothing: the run is complete. With several ranks,
        // the request every rank agreed on in the step's gather (each may have seen the signal
        // at another moment).
        const int sig = st_.step < s_.steps ? (multi() ? agreed_stop_ : signals.received()) : 0;
        const bool interval_save =
            s_.checkpoint_interval > 0 && st_.step % s_.checkpoint_interval == 0;
        if (interval_save || st_.step == s_.steps || sig != 0) {
            clear_bar();
            LATHE_RETURN_IF_ERROR(save_checkpoint());
        }
        draw_bar(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 st_.step - first_step);
        if (sig != 0) {
            clear_bar();
            stop_signal_ = sig;
            log_info(
                "stopped by {} after step {} of {}, checkpoint saved; the same command resumes "
                "from here",
                sig == SIGTERM  ? "SIGTERM"
                : sig == SIGHUP ? "SIGHUP"
                                : "SIGINT",
                st_.step, s_.steps);
            return ok_status();
        }
    }
    clear_bar();
    log_info("done: {} steps, {} skipped; checkpoint {}", st_.step, st_.skipped_steps,
             (fs::path(ckpt_->root()) / CheckpointDir::step_name(st_.step)).string());
    return ok_status();
}

void Trainer::draw_bar(double elapsed_s, int64_t steps_this_session) {
    static const bool tty = ::isatty(STDERR_FILENO) == 1;
    if (!tty || !lead() || !print_lines() || st_.step >= s_.steps) return;
    constexpr int kWidth = 30;
    const double done = double(st_.step) / double(s_.steps);
    const int filled = int(done * kWidth);
    const double eta = steps_this_session > 0
                           ? elapsed_s / double(steps_this_session) * double(s_.steps - st_.step)
                           : 0.0;
    std::fprintf(stderr, "\r\033[Kstep %lld/%lld [%s%s] %.0f%% | ETA %s", (long long)st_.step,
                 (long long)s_.steps, std::string(size_t(filled), '=').c_str(),
                 std::string(size_t(kWidth - filled), ' ').c_str(), done * 100.0,
                 Progress::format_duration(eta).c_str());
    std::fflush(stderr);
    bar_ = true;
}

void Trainer::clear_bar() {
    if (!bar_) return;
    std::fputs("\r\033[K", stderr);
    bar_ = false;
}

Status Trainer::log_line(double elapsed_s, int64_t steps_this_session) {
    const double comm_wait_ms = comm_wait_ms_;
    const int64_t comm_steps = comm_steps_;
    comm_wait_ms_ = 0.0;
    comm_steps_ = 0;
    if (multi()) {
        // Each rank's own tokens/s since this session started, shown by rank 0 at -v (every rank
        // joins the gather, whatever its log level).
        const double mine =
            elapsed_s > 0
                ? double(steps_this_session * s_.global_batch() / dp_size() * s_.seq_len) /
                      elapsed_s
                : 0.0;
        auto guard = watchdog_->arm("the gather of the ranks' tokens/s");
        LATHE_ASSIGN_OR_RETURN(const std::vector<double> per_rank,
                               all_gather_value(*world_.comm, mine, device_.context().stream));
        if (lead() && log_level() <= LogLevel::kDebug) {
            std::string text;
            for (size_t r = 0; r < per_rank.size(); ++r)
                text += fmt::format("{}rank {} {}", r ? ", " : "", r,
                                    Progress::format_count(per_rank[r]));
            log_debug("step {}: tokens/s per rank: {}", st_.step, text);
        }
    }
    if (!lead()) {
        st_.interval_loss_sum = 0.0;
        st_.interval_steps = 0;
        return ok_status();
    }
    const double mean =
        st_.interval_steps > 0 ? st_.interval_loss_sum / double(st_.interval_steps) : NAN;
    const double lr = s_.lr.lr_at(st_.step - 1);
    const double tok_s =
        elapsed_s > 0 ? double(steps_this_session * s_.tokens_per_step()) / elapsed_s : 0.0;
    const double eta = steps_this_session > 0
                           ? elapsed_s / double(steps_this_session) * double(s_.steps - st_.step)
                           : 0.0;
    const std::string comm =
        multi() ? fmt::format(" | comm wait {:.1f} ms/step",
                              comm_wait_ms / double(std::max<int64_t>(1, comm_steps)))
                : std::string();
    // MFU per GPU, as `lathe bench` computes it (run/bench.h); only where the device has a peak.
    const std::optional<double> mfu =
        peak_flops_ > 0
            ? std::optional<double>(tok_s / double(world_.size()) * flops_per_token_ / peak_flops_)
            : std::nullopt;
    const uint64_t memory = memory_in_use_bytes(device_.context());
    const std::string mfu_text = mfu ? fmt::format(" | MFU {:.1f}%", *mfu * 100.0) : std::string();
    if (print_lines())
        std::fprintf(stderr,
                     "step %lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %s tok/s%s%s | mem "
                     "%s | skipped "
                     "%lld | ETA %s\n",
                     (long long)st_.step, (long long)s_.steps, mean, lr, double(last_norm_),
                     Progress::format_count(tok_s).c_str(), mfu_text.c_str(), comm.c_str(),
                     Progress::format_bytes(double(memory)).c_str(), (long long)st_.skipped_steps,
                     Progress::format_duration(eta).c_str());
    std::vector<std::pair<std::string, MetricValue>> fields = {
        {"step", st_.step},
        {"split", std::string("train")},
        {"loss", mean},
        {"lr", lr},
        {"grad_norm", double(last_norm_)},
        {"tokens", st_.step * s_.tokens_per_step()},
        {"skipped", st_.skipped_steps},
        {"tokens_per_s", tok_s}};
    // Data parallel: the ranks, and what rank 0's compute waited on communication per step.
    if (multi()) {
        fields.emplace_back("world_size", int64_t(world_.size()));
        fields.emplace_back("comm_wait_ms",
                            comm_wait_ms / double(std::max<int64_t>(1, comm_steps)));
    }
    if (mfu) fields.emplace_back("mfu", *mfu);
    fields.emplace_back("memory_bytes", int64_t(memory));
    if (fp8_run()) fields.emplace_back("fp8_gemms", last_fp8_gemms_);
    LATHE_RETURN_IF_ERROR(metrics_.write(fields));
    if (tb_) {
        // f32, as TensorBoard keeps scalars: each the metrics.jsonl value rounded to f32.
        std::vector<TensorBoardScalar> scalars = {{"train/loss", float(mean)},
                                                  {"train/lr", float(lr)},
                                                  {"train/grad_norm", last_norm_},
                                                  {"train/tokens_per_s", float(tok_s)},
                                                  {"train/skipped", float(st_.skipped_steps)},
                                                  {"train/memory_bytes", float(memory)}};
        if (mfu) scalars.push_back({"train/mfu", float(*mfu)});
        LATHE_RETURN_IF_ERROR(tb_->write_scalars(st_.step, scalars));
    }
    st_.interval_loss_sum = 0.0;
    st_.interval_steps = 0;
    return ok_status();
}

// A resume must keep what its exactness depends on (run/train_schema.h): compares `config` with
// the configuration the newest checkpoint of the run was written with (RUN/config.yaml when the
// checkpoint does not carry one), refuses an incompatible change naming every such key, and logs
// each compatible one. Reads only: a refused resume leaves the run folder as it was.
//
// The number of ranks (`world`, this run's; the checkpoint's world_size, 1 when it has none) may
// change when the global batch (ranks x micro-batch x accumulation) stays, so that the sample
// order does: train.gradient_accumulation_steps may then change with it.
Status check_resume_config(const std::string& run_dir, const ConfigSchema& schema,
                           const Config& config, int world) {
    // Read-only: CheckpointDir::open would create and clean.
    LATHE_ASSIGN_OR_RETURN(const std::optional<std::string> newest,
                           CheckpointDir::newest_in((fs::path(run_dir) / "checkpoints").string()));
    if (!newest) return ok_status();  // a fresh start
    const fs::path checkpoint = *newest;
    std::string text, from;
    int64_t world_before = 1;
    const std::string state_path = (checkpoint / kTrainerStateFile).string();
    if (auto bytes = file_read_all(state_path); bytes.ok()) {
        const auto j = json_parse<nlohmann::json>(*bytes);
        if (j.is_object() && j.contains("config") && j.at("config").is_string()) {
            text = j.at("config").get<std::string>();
            from = state_path;
        }
        if (j.is_object() && j.contains("world_size") && j.at("world_size").is_number_integer())
            world_before = std::max<int64_t>(1, j.at("world_size").get<int64_t>());
    }
    const std::string run_config = (fs::path(run_dir) / "config.yaml").string();
    if (from.empty()) {
        if (!file_exists(run_config)) return ok_status();  // nothing recorded to compare with
        LATHE_ASSIGN_OR_RETURN(text, file_read_all(run_config));
        from = run_config;
    }
    auto before = Config::load_text(schema, text, from);
    if (!before.ok()) {
        return failed_precondition_error(
            "--run-dir {} resumes from {}, but the configuration it was written with "
            "cannot be read to check the resume against ({}); train into a new "
            "--run-dir",
            run_dir, checkpoint.string(), before.status().message());
    }
    std::vector<TrainConfigChange> changes = train_config_changes(*before, config);
    const char* kAccum = "train.gradient_accumulation_steps";
    const char* kMicro = "train.micro_batch_size";
    const int64_t global_before = world_before * before->get_int(kMicro) * before->get_int(kAccum);
    const int64_t global_now = int64_t(world) * config.get_int(kMicro) * config.get_int(kAccum);
    std::string refused;
    if (world_before != world) {
        if (global_before != global_now) {
            refused = fmt::format(
                "the global batch (ranks x {} x {}) {} x {} x {} = {} -> {} x {} x {} = {} "
                "(with another number of ranks, set {} so that the global batch stays)",
                kMicro, kAccum, world_before, before->get_int(kMicro), before->get_int(kAccum),
                global_before, world, config.get_int(kMicro), config.get_int(kAccum), global_now,
                kAccum);
        }
        for (TrainConfigChange& c : changes)
            if (c.key == kAccum) c.compatible = true;  // the global batch decides (above)
    }
    for (const TrainConfigChange& c : changes) {
        if (!c.compatible)
            refused +=
                fmt::format("{}{} {} -> {}", refused.empty() ? "" : ", ", c.key, c.before, c.after);
    }
    if (!refused.empty()) {
        return failed_precondition_error(
            "--run-dir {} resumes from {}, but this configuration changes what an exact "
            "resume depends on: {} (the run's value -> this one). Set them back (the "
            "run's configuration: {}), or train into a new --run-dir; `lathe train "
            "--help` lists the keys a resume may change",
            run_dir, checkpoint.string(), refused, run_config);
    }
    if (world_before != world) {
        log_info(
            "resuming a checkpoint of {} ranks with {}: each rank reads its part of the "
            "optimizer state",
            world_before, world);
    }
    for (const TrainConfigChange& c : changes) {
        log_info("resuming with a changed {}: {} -> {}", c.key, c.before, c.after);
    }
    return ok_status();
}

}  // namespace

Result<TrainOutcome> train_run(const TrainRequest& request) {
    if (request.run_dir.empty()) return invalid_argument_error("--run-dir is required");
    const ConfigSchema schema = train_config_schema();  // outlives the Config that points to it
    LATHE_ASSIGN_OR_RETURN(Config config,
                           Config::load(schema, request.config_files, request.overrides));
    LATHE_ASSIGN_OR_RETURN(TrainSettings settings, train_settings_resolve(config));
    // This process's rank (the world opens later, in the trainer).
    LATHE_ASSIGN_OR_RETURN(const ProcessGroupInfo group,
                           process_group_from_env(process_environment()));
    // One voice: ranks other than 0 report warnings and errors only.
    if (group.rank != 0 && log_level() < LogLevel::kWarning) log_set_level(LogLevel::kWarning);
    Trainer trainer(request, std::move(config), std::move(settings));
    LATHE_RETURN_IF_ERROR(trainer.run());
    return trainer.outcome();
}

}  // namespace lathe
