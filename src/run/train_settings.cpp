#include "run/train_settings.h"

#include <fmt/format.h>

#include <filesystem>
#include <initializer_list>
#include <limits>
#include <utility>

#include "core/log.h"
#include "data/gpt2_dataset.h"
#include "io/file.h"
#include "model/model.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "run/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

Status require_at_least(const Config& c, std::string_view key, int64_t min) {
    const int64_t v = c.get_int(key);
    if (v < min) {
        return invalid_argument_error("{}: '{}' must be >= {}, got {}", c.source_of(key), key, min,
                                      v);
    }
    return ok_status();
}

// String key `key`, when set, as one of `choices` (name, value) into `out`; another string is
// an error naming the key and the names in `choices`' order.
template <typename T>
Status resolve_choice(const Config& c, std::string_view key,
                      std::initializer_list<std::pair<const char*, T>> choices, T& out) {
    if (!c.has(key)) return ok_status();
    const std::string v = c.get_string(key);
    std::string names;
    size_t i = 0;
    for (const auto& [name, value] : choices) {
        if (v == name) {
            out = value;
            return ok_status();
        }
        names += i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", ");
        names += name;
        ++i;
    }
    return invalid_argument_error("{}: '{}' is '{}'; choose {}", c.source_of(key), key, v, names);
}

// optimizer.offload / offload_fraction / offload_schedule / state_dtype: unset keys take none, 1,
// overlapped and fp32.
Status resolve_offload(const Config& c, OffloadSettings& out) {
    LATHE_RETURN_IF_ERROR(resolve_choice(
        c, "optimizer.offload",
        {{"none", OptimizerOffload::kNone}, {"cpu", OptimizerOffload::kCpu}}, out.offload));
    if (c.has("optimizer.offload_fraction")) {
        const double f = c.get_float("optimizer.offload_fraction");
        if (!(f > 0.0 && f <= 1.0))
            return invalid_argument_error(
                "{}: 'optimizer.offload_fraction' must be in (0, 1] (the fraction of the "
                "parameters whose AdamW state lives in host memory), got {}",
                c.source_of("optimizer.offload_fraction"), f);
        out.fraction = f;
    }
    LATHE_RETURN_IF_ERROR(resolve_choice(c, "optimizer.offload_schedule",
                                         {{"overlapped", OffloadSchedule::kOverlapped},
                                          {"serial", OffloadSchedule::kSerial},
                                          {"delayed", OffloadSchedule::kDelayed}},
                                         out.schedule));
    return resolve_choice(c, "optimizer.state_dtype",
                          {{"fp32", AdamWStateDType::kF32}, {"bf16", AdamWStateDType::kBF16}},
                          out.state_dtype);
}

// What lathe train runs of the offload keys: optimizer.offload: cpu with any offload_fraction
// (optim/host_optimizer.h); fp32 or bf16 moments with or without it (optimizer.state_dtype). The
// rest stops the run here, after every other key is checked, rather than being ignored.
Status refuse_offload(const Config& c, const OffloadSettings& o) {
    if (o.offload != OptimizerOffload::kCpu && o.fraction < 1.0)
        return invalid_argument_error(
            "{}: 'optimizer.offload_fraction' {} offloads part of the optimizer, which needs "
            "optimizer.offload: cpu (docs/SFT.md, \"Optimizer offload\"); set "
            "optimizer.offload: cpu, or remove the key",
            c.source_of("optimizer.offload_fraction"), o.fraction);
    if (o.offload != OptimizerOffload::kCpu && c.has("optimizer.offload_schedule"))
        return invalid_argument_error(
            "{}: 'optimizer.offload_schedule' orders the host optimizer's steps, which runs with "
            "optimizer.offload: cpu only (docs/SFT.md, \"Optimizer offload\"); set "
            "optimizer.offload: cpu, or remove the key (optimizer.schedule orders the GPU's)",
            c.source_of("optimizer.offload_schedule"));
    if (o.schedule == OffloadSchedule::kDelayed && o.fraction < 1.0)
        return invalid_argument_error(
            "{}: 'optimizer.offload_schedule: delayed' runs every optimizer update on the host, "
            "one step behind the GPU, but 'optimizer.offload_fraction' {} keeps part of it on the "
            "GPU; set optimizer.offload_fraction: 1 (the delayed update hides the whole host "
            "step), or choose offload_schedule overlapped",
            c.source_of("optimizer.offload_schedule"), o.fraction);
    return ok_status();
}

Result<const ModelFamily*> family_named(const Config& c) {
    const std::string name = c.get_string("model.family");
    Result<const ModelFamily*> family = model_family_find(name);
    if (family.ok()) return family;
    return invalid_argument_error("{}: 'model.family' is '{}'; choose {}",
                                  c.source_of("model.family"), name,
                                  model_family_names(", ", " or "));
}

// Applies the inline model.* keys that are set on top of `hf`.
void apply_inline_model_keys(const Config& c, HfModelConfig& hf) {
    const bool heads_set = c.has("model.num_attention_heads");
    const bool width_set = c.has("model.hidden_size");
    if (width_set) hf.hidden_size = c.get_int("model.hidden_size");
    if (c.has("model.intermediate_size"))
        hf.intermediate_size = c.get_int("model.intermediate_size");
    else if (width_set && hf.family->hf_intermediate_per_hidden > 0)
        hf.intermediate_size = hf.family->hf_intermediate_per_hidden * hf.hidden_size;
    if (c.has("model.num_hidden_layers"))
        hf.num_hidden_layers = c.get_int("model.num_hidden_layers");
    if (heads_set) hf.num_attention_heads = c.get_int("model.num_attention_heads");
    if (c.has("model.num_key_value_heads")) {
        hf.num_key_value_heads = c.get_int("model.num_key_value_heads");
    } else if (heads_set) {
        hf.num_key_value_heads = hf.num_attention_heads;  // plain multi-head unless said otherwise
    }
    if (c.has("model.head_dim")) {
        hf.head_dim = c.get_int("model.head_dim");
    } else if ((heads_set || width_set) && hf.num_attention_heads > 0) {
        hf.head_dim = hf.hidden_size / hf.num_attention_heads;
    }
    if (c.has("model.max_position_embeddings"))
        hf.max_position_embeddings = c.get_int("model.max_position_embeddings");
    if (c.has("model.rope_theta")) hf.rope_theta = c.get_float("model.rope_theta");
    if (c.has("model.norm_eps")) hf.norm_eps = c.get_float("model.norm_eps");
    if (c.has("model.tie_word_embeddings"))
        hf.tie_word_embeddings = c.get_bool("model.tie_word_embeddings");
    if (c.has("model.sliding_window")) {
        hf.sliding_window = c.get_int("model.sliding_window");
        // A family whose windows need turning on (use_sliding_window) gets them turned on.
        if (hf.family->hf_settings & kHfWindowLayers) hf.use_sliding_window = true;
    }
}

// Each model.* key that is set must describe the model `hf` already is (a checkpoint's).
Status check_model_keys_agree(const Config& c, const HfModelConfig& hf, const std::string& origin) {
    struct Field {
        const char* key;
        double value;
    };
    const Field fields[] = {
        {"model.hidden_size", double(hf.hidden_size)},
        {"model.intermediate_size", double(hf.intermediate_size)},
        {"model.num_hidden_layers", double(hf.num_hidden_layers)},
        {"model.num_attention_heads", double(hf.num_attention_heads)},
        {"model.num_key_value_heads", double(hf.num_key_value_heads)},
        {"model.head_dim", double(hf.head_dim)},
        {"model.max_position_embeddings", double(hf.max_position_embeddings)},
        {"model.rope_theta", hf.rope_theta},
        {"model.norm_eps", hf.norm_eps},
        {"model.vocab_size", double(hf.vocab_size)},
        {"model.sliding_window", hf.sliding_window ? double(*hf.sliding_window) : -1.0},
    };
    for (const Field& f : fields) {
        if (!c.has(f.key)) continue;
        const ConfigKey* key = c.schema().find(f.key);
        const double want =
            key->type == ConfigType::kInt ? double(c.get_int(f.key)) : c.get_float(f.key);
        if (want != f.value) {
            return invalid_argument_error(
                "{}: '{}' is {} but the checkpoint {} has {}; drop the key or make it agree",
                c.source_of(f.key), f.key, want, origin, f.value);
        }
    }
    if (c.has("model.tie_word_embeddings") &&
        c.get_bool("model.tie_word_embeddings") != hf.tie_word_embeddings) {
        return invalid_argument_error(
            "{}: 'model.tie_word_embeddings' disagrees with the checkpoint {}",
            c.source_of("model.tie_word_embeddings"), origin);
    }
    return ok_status();
}

Result<std::vector<double>> weights_for(const Config& c, size_t n_paths) {
    if (!c.has("data.weights")) return std::vector<double>(n_paths, 1.0);
    std::vector<double> w = c.get_float_list("data.weights");
    if (w.size() != n_paths) {
        return invalid_argument_error("{}: 'data.weights' has {} entries but 'data.path' has {}",
                                      c.source_of("data.weights"), w.size(), n_paths);
    }
    for (double x : w) {
        if (!(x >= 0.0)) {
            return invalid_argument_error("{}: 'data.weights' must be >= 0, got {}",
                                          c.source_of("data.weights"), x);
        }
    }
    return w;
}

Status check_prefixes_exist(const Config& c, std::string_view key,
                            const std::vector<std::string>& prefixes) {
    for (const std::string& p : prefixes) {
        for (const char* ext : {".bin", ".idx"}) {
            if (!file_exists(p + ext)) {
                return not_found_error(
                    "{}: '{}' names '{}', but {}{} does not exist (make it with "
                    "`lathe prepare ... --output-prefix {}`)",
                    c.source_of(key), key, p, p, ext, p);
            }
        }
    }
    return ok_status();
}

}  // namespace

int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by) {
    if (divisible_by <= 1) return vocab;
    return (vocab + divisible_by - 1) / divisible_by * divisible_by;
}

bool glob_match(std::string_view pattern, std::string_view name) {
    size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
    while (n < name.size()) {
        if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
            ++p;
            ++n;
        } else if (p < pattern.size() && pattern[p] == '*') {
            star = p++;
            mark = n;
        } else if (star != std::string_view::npos) {
            p = star + 1;
            n = ++mark;
        } else {
            return false;
        }
    }
    while (p < pattern.size() && pattern[p] == '*') ++p;
    return p == pattern.size();
}

Result<TrainSettings> train_settings_resolve(const Config& c) {
    TrainSettings s;

    // ---- sizes and counts ----
    for (auto [key, min] : {std::pair<const char*, int64_t>{"train.steps", 1},
                            {"train.micro_batch_size", 1},
                            {"train.gradient_accumulation_steps", 1},
                            {"train.log_interval", 1},
                            {"train.eval_interval", 0},
                            {"train.eval_iters", 0},
                            {"train.threads", 0},
                            {"train.max_skipped_steps", 0},
                            {"data.seq_length", 1},
                            {"lr.decay_steps", 0},
                            {"checkpoint.interval", 0},
                            {"checkpoint.keep_last", 0},
                            {"model.make_vocab_size_divisible_by", 1}}) {
        LATHE_RETURN_IF_ERROR(require_at_least(c, key, min));
    }
    // Settings held as int: larger values are refused, not truncated.
    for (std::string_view key : {"train.threads", "checkpoint.keep_last"}) {
        if (c.get_int(key) > std::numeric_limits<int>::max()) {
            return invalid_argument_error("{}: '{}' must be at most {}, got {}", c.source_of(key),
                                          key, std::numeric_limits<int>::max(), c.get_int(key));
        }
    }
    s.steps = c.get_int("train.steps");
    s.micro_batch = c.get_int("train.micro_batch_size");
    s.grad_accum = c.get_int("train.gradient_accumulation_steps");
    s.log_interval = c.get_int("train.log_interval");
    s.tensorboard = c.get_bool("logging.tensorboard");
    s.eval_interval = c.get_int("train.eval_interval");
    s.eval_iters = c.get_int("train.eval_iters");
    s.seed = static_cast<uint64_t>(c.get_int("train.seed"));
    s.threads = static_cast<int>(c.get_int("train.threads"));
    s.deterministic = c.get_bool("train.deterministic");
    s.seq_len = c.get_int("data.seq_length");
    s.max_skipped = c.get_int("train.max_skipped_steps");
    s.spike_factor = c.get_float("train.spike_factor");
    if (s.spike_factor != 0.0 && !(s.spike_factor > 1.0)) {
        return invalid_argument_error("{}: 'train.spike_factor' must be 0 (off) or > 1, got {}",
                                      c.source_of("train.spike_factor"), s.spike_factor);
    }
    s.freeze = c.get_string_list("train.freeze");
    s.zero_stage = int(c.get_int("parallel.zero_stage"));
    if (s.zero_stage < 0 || s.zero_stage > 3) {
        return invalid_argument_error(
            "{}: 'parallel.zero_stage' {}: lathe trains at stage 0 (optimizer state on every "
            "rank), 1 (optimizer state sharded over the ranks), 2 (optimizer state and "
            "gradients sharded) or 3 (optimizer state, gradients and parameters sharded)",
            c.source_of("parallel.zero_stage"), c.get_int("parallel.zero_stage"));
    }
    // An integer key within [lo, hi]; `what` says what it counts.
    auto int_key = [&](std::string_view key, int64_t lo, int64_t hi,
                       std::string_view what) -> Result<int> {
        const int64_t v = c.get_int(key);
        if (v < lo || v > hi)
            return invalid_argument_error("{}: '{}' must be {}, {} to {}, got {}", c.source_of(key),
                                          key, what, lo, hi, v);
        return int(v);
    };
    LATHE_ASSIGN_OR_RETURN(s.tensor, int_key("parallel.tensor", 1, 4096,
                                             "the ranks of a tensor-parallel group (1: off)"));
    s.sequence_parallel = c.get_bool("parallel.sequence_parallel");
    s.tensor_overlap = c.get_bool("parallel.tensor_overlap");
    LATHE_ASSIGN_OR_RETURN(
        s.tensor_overlap_chunks,
        int_key("parallel.tensor_overlap_chunks", 1, 8,
                "the forward's row chunks, each all-gathered while the one before it computes"));
    LATHE_ASSIGN_OR_RETURN(s.tensor_overlap_sms,
                           int_key("parallel.tensor_overlap_sms", 0, 64,
                                   "the SMs the overlapped GEMMs leave to the collectives"));
    s.timeout_s = c.get_float("parallel.timeout_s");
    if (!(s.timeout_s >= 0.0) || s.timeout_s > 1e7) {
        return invalid_argument_error(
            "{}: 'parallel.timeout_s' must be seconds between 0 (wait forever) and 1e7, got {}",
            c.source_of("parallel.timeout_s"), s.timeout_s);
    }
    s.checkpoint_interval = c.get_int("checkpoint.interval");
    s.keep_last = static_cast<int>(c.get_int("checkpoint.keep_last"));

    const std::string device = c.get_string("train.device");
    if (!compute_device_name_valid(device)) {
        return invalid_argument_error(
            "{}: 'train.device' is '{}'; choose auto, cpu or cuda (cuda:N for GPU N)",
            c.source_of("train.device"), device);
    }
    s.device = device;
    const std::string precision = c.get_string("train.precision");
    if (precision != "fp32" && precision != "bf16" && precision != "fp8") {
        return invalid_argument_error("{}: 'train.precision' is '{}'; choose fp32, bf16 or fp8",
                                      c.source_of("train.precision"), precision);
    }
    // The fp8.* keys are checked in every run, so a mistyped recipe shows before it is used.
    auto fp8 = fp8_settings_parse(c.get_string("fp8.recipe"), c.get_string("fp8.grad_format"),
                                  c.get_bool("fp8.lm_head"), c.get_int("fp8.amax_history"),
                                  c.get_string("fp8.amax_reduction"),
                                  [&c](std::string_view key) { return c.source_of(key); });
    if (!fp8.ok()) return fp8.status();
    s.fp8 = fp8.value();
    s.precision = precision;
    if (precision == "fp8" && s.fp8.lm_head && s.tensor > 1) {
        // The FP8 head runs on the whole vocabulary; tensor parallel splits it by rows.
        return unimplemented_error(
            "{}: 'fp8.lm_head: true' with 'parallel.tensor' {}: the FP8 LM head takes the whole "
            "vocabulary, and tensor parallel splits the head by vocabulary rows; remove "
            "fp8.lm_head (the head trains in bf16) or set parallel.tensor 1",
            c.source_of("fp8.lm_head"), s.tensor);
    }
    if (precision == "fp8" && device == "cpu") {
        return invalid_argument_error(
            "{}: 'train.precision: fp8' with 'train.device: cpu': the CPU backend has no fp8 "
            "linear (fp8 trains on a GPU with FP8 tensor cores, compute capability 8.9 or "
            "newer); set train.device cuda (or auto), or train.precision fp32 on the CPU",
            c.source_of("train.precision"));
    }
    if (precision == "fp32" && device.starts_with("cuda")) {
        return invalid_argument_error(
            "{}: 'train.precision: fp32' with 'train.device: cuda': the CUDA backend "
            "trains in bf16 (fp32 master weights); set precision bf16, or device cpu",
            c.source_of("train.precision"));
    }
    if (precision == "fp32" && device == "auto") s.device = "cpu";
    const std::string recompute = c.get_string("train.recompute");
    const std::optional<Recompute> recompute_mode = recompute_from_name(recompute);
    if (!recompute_mode) {
        return invalid_argument_error(
            "{}: 'train.recompute' is '{}'; choose none, selective or full",
            c.source_of("train.recompute"), recompute);
    }
    s.recompute = *recompute_mode;
    const std::string policy = c.get_string("train.nonfinite_policy");
    if (policy == "skip")
        s.nonfinite = NonfinitePolicy::kSkip;
    else if (policy == "stop")
        s.nonfinite = NonfinitePolicy::kStop;
    else
        return invalid_argument_error("{}: 'train.nonfinite_policy' is '{}'; choose skip or stop",
                                      c.source_of("train.nonfinite_policy"), policy);

    // ---- optimizer and schedule ----
    s.adam.beta1 = c.get_float("optimizer.beta1");
    s.adam.beta2 = c.get_float("optimizer.beta2");
    s.adam.eps = c.get_float("optimizer.eps");
    for (const char* key : {"optimizer.beta1", "optimizer.beta2"}) {
        const double b = c.get_float(key);
        if (!(b >= 0.0 && b < 1.0))
            return invalid_argument_error("{}: '{}' must be in [0, 1), got {}", c.source_of(key),
                                          key, b);
    }
    if (!(s.adam.eps > 0.0))
        return invalid_argument_error("{}: 'optimizer.eps' must be > 0",
                                      c.source_of("optimizer.eps"));
    s.weight_decay = c.get_float("optimizer.weight_decay");
    if (!(s.weight_decay >= 0.0))
        return invalid_argument_error("{}: 'optimizer.weight_decay' must be >= 0",
                                      c.source_of("optimizer.weight_decay"));
    s.grad_clip = c.get_float("optimizer.gradient_clipping");
    if (!(s.grad_clip >= 0.0))
        return invalid_argument_error("{}: 'optimizer.gradient_clipping' must be >= 0 (0 = off)",
                                      c.source_of("optimizer.gradient_clipping"));
    LATHE_RETURN_IF_ERROR(resolve_offload(c, s.offload));
    LATHE_RETURN_IF_ERROR(resolve_choice(
        c, "optimizer.schedule",
        {{"serial", OptimizerSchedule::kSerial}, {"overlapped", OptimizerSchedule::kOverlapped}},
        s.schedule));
    if (s.schedule == OptimizerSchedule::kOverlapped && s.offload.offload == OptimizerOffload::kCpu)
        return invalid_argument_error(
            "{}: 'optimizer.schedule: overlapped' schedules the device optimizer; with "
            "optimizer.offload: cpu set optimizer.offload_schedule instead and remove "
            "optimizer.schedule",
            c.source_of("optimizer.schedule"));
    LATHE_ASSIGN_OR_RETURN(
        s.optimizer_sms,
        int_key("optimizer.overlap_sms", 0, AdamWOptimizer::kMaxOptimizerSms,
                "the SMs the forward's GEMMs leave to the overlapped device AdamW"));
    if (s.optimizer_sms > 0 && s.schedule != OptimizerSchedule::kOverlapped)
        return invalid_argument_error(
            "{}: 'optimizer.overlap_sms' {} is read by the overlapped schedule: set "
            "optimizer.schedule: overlapped, or remove optimizer.overlap_sms",
            c.source_of("optimizer.overlap_sms"), s.optimizer_sms);
    auto style = lr_decay_style_from_string(c.get_string("lr.decay_style"));
    if (!style.ok())
        return style.status().with_context(c.source_of("lr.decay_style") + ": 'lr.decay_style'");
    const int64_t decay_steps =
        c.get_int("lr.decay_steps") > 0 ? c.get_int("lr.decay_steps") : s.steps;
    auto sched = LrSchedule::make(c.get_float("optimizer.lr"), c.get_float("optimizer.min_lr"),
                                  c.get_float("lr.warmup"), decay_steps, *style);
    if (!sched.ok())
        return sched.status().with_context(
            "optimizer.lr / optimizer.min_lr / lr.warmup / lr.decay_steps");
    s.lr = *sched;

    // ---- checkpoint init ----
    s.init_from = c.has("checkpoint.init_from") ? c.get_string("checkpoint.init_from") : "";
    const std::string mode = c.get_string("checkpoint.init_mode");
    if (mode == "finetune")
        s.init_mode = InitMode::kFinetune;
    else if (mode == "continue")
        s.init_mode = InitMode::kContinue;
    else
        return invalid_argument_error(
            "{}: 'checkpoint.init_mode' is '{}'; choose finetune or continue",
            c.source_of("checkpoint.init_mode"), mode);

    // ---- tokenizer and vocabulary ----
    s.tokenizer_path = c.get_string("data.tokenizer");
    auto tok = Tokenizer::load(s.tokenizer_path);
    if (!tok.ok())
        return tok.status().with_context(c.source_of("data.tokenizer") + ": 'data.tokenizer'");
    s.tokenizer_vocab = tok->vocab_size();

    // ---- model ----
    HfModelConfig hf;
    if (!s.init_from.empty()) {
        auto resolved = resolve_checkpoint(s.init_from);  // a run folder, checkpoints/latest, ...
        if (!resolved.ok())
            return resolved.status().with_context(c.source_of("checkpoint.init_from") +
                                                  ": 'checkpoint.init_from'");
        s.init_from = resolved->string();
        auto loaded = hf_config_load(s.init_from);
        if (!loaded.ok())
            return loaded.status().with_context(c.source_of("checkpoint.init_from") +
                                                ": 'checkpoint.init_from'");
        hf = *loaded;
        s.model_source = "checkpoint.init_from=" + s.init_from;
        // The same config often serves pretraining and fine-tuning: model.* keys may stay, but
        // each must agree with the checkpoint's config.json.
        if (c.has("model.family")) {
            LATHE_ASSIGN_OR_RETURN(const ModelFamily* family, family_named(c));
            if (family != hf.family) {
                return invalid_argument_error(
                    "{}: 'model.family' is {} but checkpoint.init_from {} holds a {} model",
                    c.source_of("model.family"), family->model_type, s.init_from, hf.model_type());
            }
        }
        if (c.has("model.config")) {
            return invalid_argument_error(
                "{}: set either 'model.config' or 'checkpoint.init_from' (the model comes "
                "from the checkpoint's config.json)",
                c.source_of("model.config"));
        }
        LATHE_RETURN_IF_ERROR(check_model_keys_agree(c, hf, s.init_from));
    } else if (c.has("model.config")) {
        auto loaded = hf_config_load(c.get_string("model.config"));
        if (!loaded.ok())
            return loaded.status().with_context(c.source_of("model.config") + ": 'model.config'");
        hf = *loaded;
        s.model_source = "model.config=" + c.get_string("model.config");
        if (c.has("model.family")) {
            return invalid_argument_error(
                "{}: set either 'model.config' or 'model.family', not both",
                c.source_of("model.family"));
        }
        apply_inline_model_keys(c, hf);
    } else {
        if (!c.has("model.family")) {
            return invalid_argument_error(
                "no model: set 'model.config' (a Hugging Face config.json) or "
                "'model.family' with the model.* sizes");
        }
        LATHE_ASSIGN_OR_RETURN(const ModelFamily* family, family_named(c));
        hf = hf_config_default(*family);
        for (const char* key :
             {"model.hidden_size", "model.num_hidden_layers", "model.num_attention_heads"}) {
            if (!c.has(key)) {
                return invalid_argument_error(
                    "'model.family: {}' needs '{}' (the defaults describe a multi-billion "
                    "parameter model)",
                    c.get_string("model.family"), key);
            }
        }
        apply_inline_model_keys(c, hf);
        s.model_source = "inline model.* keys";
    }
    const int64_t padded =
        padded_vocab_size(s.tokenizer_vocab, c.get_int("model.make_vocab_size_divisible_by"));
    if (c.has("model.vocab_size")) {
        hf.vocab_size = c.get_int("model.vocab_size");
    } else if (s.init_from.empty() && !c.has("model.config")) {
        hf.vocab_size = padded;
    }
    if (hf.vocab_size < s.tokenizer_vocab) {
        return invalid_argument_error(
            "the model's vocab_size {} ({}) is smaller than the tokenizer's {} ({}); "
            "token ids would fall outside the embedding",
            hf.vocab_size, s.model_source, s.tokenizer_vocab, s.tokenizer_path);
    }
    // The special ids the checkpoints' config.json (and so generate) uses are the tokenizer's: a
    // model built here from transformers' class defaults takes them all from it.
    LATHE_ASSIGN_OR_RETURN(const TokenizerSpecialTokens specials,
                           tokenizer_special_tokens(*tok, s.tokenizer_path));
    const bool new_model = s.init_from.empty() && !c.has("model.config");
    for (const std::string& change : special_ids_apply(
             hf, *tok, specials,
             new_model ? SpecialIdsMode::kFromTokenizer : SpecialIdsMode::kKeepValid)) {
        log_info("{} from {} ({})", change, specials.source, s.model_source);
    }
    auto model = model_config_from_hf(hf, s.model_source);
    if (!model.ok()) return model.status();
    s.model = std::move(model).value();
    if (s.seq_len > s.model.max_position_embeddings) {
        return invalid_argument_error(
            "{}: 'data.seq_length' is {} but the model allows at most {} "
            "(max_position_embeddings, {})",
            c.source_of("data.seq_length"), s.seq_len, s.model.max_position_embeddings,
            s.model_source);
    }
    if (s.precision == "fp8") {
        // What the fp8 linears need of the model and the batch (model/model.h), before any work.
        ModelShape shape;
        shape.batch = s.micro_batch;
        shape.seq_len = s.seq_len;
        shape.precision = fp8_precision_policy(s.fp8);
        shape.fp8 = s.fp8;
        const Status fp8_ok = model_check_fp8(s.model, shape);
        if (!fp8_ok.ok())
            return Status(fp8_ok.code(), fmt::format("{}: 'train.precision: fp8' ({}): {}",
                                                     c.source_of("train.precision"), s.model_source,
                                                     fp8_ok.message()));
    }

    // ---- data ----
    const std::vector<std::string> paths = c.get_string_list("data.path");
    if (paths.empty()) {
        return invalid_argument_error(
            "{}: 'data.path' is an empty list; give the prefix of the token files (or a list of "
            "them, a blend) that `lathe prepare --output-prefix` wrote",
            c.source_of("data.path"));
    }
    LATHE_RETURN_IF_ERROR(check_prefixes_exist(c, "data.path", paths));
    const std::vector<std::string> labels = c.has("data.label_path")
                                                ? c.get_string_list("data.label_path")
                                                : std::vector<std::string>{};
    if (!labels.empty() && labels.size() != paths.size()) {
        return invalid_argument_error("{}: 'data.label_path' has {} entries but 'data.path' has {}",
                                      c.source_of("data.label_path"), labels.size(), paths.size());
    }
    LATHE_RETURN_IF_ERROR(check_prefixes_exist(c, "data.label_path", labels));
    GptNeoxDataArgs& d = s.data;
    d.seq_length = s.seq_len;
    d.seed = static_cast<uint32_t>(s.seed);
    d.train_iters = s.steps;
    d.train_batch_size = s.micro_batch * s.grad_accum;
    d.eval_interval = s.eval_interval > 0 ? s.eval_interval : s.steps;
    d.eval_iters = s.eval_iters;
    d.split = c.get_string("data.split");
    LATHE_ASSIGN_OR_RETURN(std::vector<double> weights, weights_for(c, paths.size()));
    const bool explicit_lists =
        c.has("data.valid_path") || c.has("data.test_path") || paths.size() > 1 || !labels.empty();
    if (!explicit_lists) {
        d.data_path = paths[0];
    } else {
        if (!c.has("data.valid_path")) {
            return invalid_argument_error(
                "several 'data.path' entries (a blend) or label files need explicit "
                "validation data: set 'data.valid_path' (GPT-NeoX's valid_data_paths)");
        }
        d.train_data_paths = paths;
        d.train_data_weights = weights;
        d.train_label_data_paths = labels;
        d.valid_data_paths = c.get_string_list("data.valid_path");
        LATHE_RETURN_IF_ERROR(check_prefixes_exist(c, "data.valid_path", d.valid_data_paths));
        d.valid_data_weights.assign(d.valid_data_paths.size(), 1.0);
        d.test_data_paths =
            c.has("data.test_path") ? c.get_string_list("data.test_path") : d.valid_data_paths;
        LATHE_RETURN_IF_ERROR(check_prefixes_exist(c, "data.test_path", d.test_data_paths));
        d.test_data_weights.assign(d.test_data_paths.size(), 1.0);
        if (!labels.empty()) {
            if (!c.has("data.valid_label_path")) {
                return invalid_argument_error(
                    "'data.label_path' needs 'data.valid_label_path' for the validation data");
            }
            d.valid_label_data_paths = c.get_string_list("data.valid_label_path");
            d.test_label_data_paths = c.has("data.test_label_path")
                                          ? c.get_string_list("data.test_label_path")
                                          : d.valid_label_data_paths;
        }
    }
    s.per_document_attention = c.get_bool("data.per_document_attention");
    LATHE_RETURN_IF_ERROR(refuse_offload(c, s.offload));
    return s;
}

}  // namespace lathe
