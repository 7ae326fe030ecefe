#include "run/bench_generate.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <vector>

#include "core/log.h"
#include "dist/process_group.h"
#include "infer/engine.h"
#include "infer/tensor_parallel.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "model/registry.h"
#include "ops/cuda/memory.h"
#include "ops/device_info.h"
#include "run/compute_device.h"
#include "run/inference_processes.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace lathe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int32_t> random_tokens(std::mt19937_64& gen, int64_t count, int64_t vocab) {
    std::uniform_int_distribution<int32_t> id(0, int32_t(vocab - 1));
    std::vector<int32_t> out(static_cast<size_t>(count));
    for (int32_t& t : out) t = id(gen);
    return out;
}

// What an engine of `limits` allocates (infer/engine.cpp's create): the KV cache rows and the
// scratch arena, counted as their buffers' sizes without alignment padding.
size_t engine_bytes(const ModelConfig& c, const EngineLimits& limits, size_t act) {
    const size_t N = size_t(std::max(limits.prefill_chunk, limits.max_sequences));
    const size_t S = size_t(limits.max_sequences), T = size_t(limits.max_len);
    const size_t C = size_t(c.hidden_size), H = size_t(c.num_heads), Hkv = size_t(c.num_kv_heads);
    const size_t D = size_t(c.head_dim), F = size_t(c.intermediate_size);
    const size_t up = c.mlp == MlpKind::kSwiGlu ? 2 * F : F;
    const size_t kv = size_t(c.num_layers) * 2 * S * T * Hkv * D * act;
    const size_t scratch =
        act * (N * (4 * C + 2 * H * D + up + F) + 2 * S * Hkv * D + S * size_t(c.vocab_size)) +
        4 * (N * (2 + H) + 2 * N + S + 2 * T * D);
    return kv + scratch;
}

// Bytes/s of device-to-device copies of `bytes` (reads plus writes: 2 x bytes per copy), the
// best of five after one warm-up copy. The buffers are freed on return.
Result<double> copy_bandwidth(const Context& ctx, size_t bytes, const ComputeDevice& device) {
    ArenaLayout layout;
    const Shape shape{int64_t(bytes)};
    LATHE_ASSIGN_OR_RETURN(const size_t src, layout.add("copy_src", DType::kU8, shape));
    LATHE_ASSIGN_OR_RETURN(const size_t dst, layout.add("copy_dst", DType::kU8, shape));
    Result<ModelArena> arena = ModelArena::allocate(std::move(layout), ctx);
    if (!arena.ok())
        return arena.status().with_context(
            fmt::format("the bandwidth copy's two buffers of {}", format_bytes(bytes)));
    device.synchronize();
    double best = 0.0;
    for (int i = 0; i < 6; ++i) {
        const auto t0 = Clock::now();
        cuda_copy_async(arena->view(dst), arena->view(src), ctx.stream);
        device.synchronize();
        const double s = seconds_since(t0);
        if (i > 0 && s > 0) best = std::max(best, 2.0 * double(bytes) / s);
    }
    return best;
}

Status check_fits(const ComputeDevice& device, size_t need, std::string_view what) {
    const size_t have = device.available_memory_bytes();
    if (have == 0 || need <= have) return ok_status();
    return invalid_argument_error(
        "{} needs about {} of memory, {} has {} free; lower the lengths or batches ({}), or "
        "measure a smaller model",
        what, format_bytes(need), device.describe(), format_bytes(have),
        "--prefill, --decode-batches, --prompt-len, --decode-steps");
}

}  // namespace

double generate_prefill_flops(const ModelConfig& c, int64_t tokens) {
    const double head = double(c.vocab_size) * double(c.hidden_size);
    const double body = double(bench_flop_parameters(c)) - head;
    const double T = double(tokens);
    const double attention =
        2.0 * double(c.num_layers) * double(c.num_heads) * double(c.head_dim) * T * (T + 1.0);
    return 2.0 * body * T + 2.0 * head + attention;
}

double generate_weight_bytes(const ModelConfig& c, int64_t weight_bytes) {
    return double(bench_flop_parameters(c)) * double(weight_bytes);
}

double generate_kv_bytes_per_position(const ModelConfig& c, int64_t cache_bytes) {
    return 2.0 * double(c.num_layers) * double(c.num_kv_heads) * double(c.head_dim) *
           double(cache_bytes);
}

double generate_step_bytes(const ModelConfig& c, int64_t element_bytes,
                           const std::vector<int64_t>& lengths) {
    double positions = 0.0;
    for (const int64_t l : lengths) positions += double(l);
    return generate_weight_bytes(c, element_bytes) +
           generate_kv_bytes_per_position(c, element_bytes) * positions;
}

Result<std::vector<int64_t>> parse_length_list(const std::string& text, std::string_view flag) {
    std::vector<int64_t> out;
    if (text.empty()) return out;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        const std::string item =
            text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        size_t used = 0;
        long long value = 0;
        bool ok = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
        if (ok) {
            try {
                value = std::stoll(item, &used);
            } catch (const std::exception&) {
                ok = false;
            }
        }
        if (!ok || used != item.size() || value < 1) {
            return invalid_argument_error(
                "{} '{}': '{}' is not a positive integer; give a comma-separated list such as "
                "1,16,64",
                flag, text, item);
        }
        out.push_back(int64_t(value));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

Result<std::string> bench_generate_run(const GenerateBenchRequest& req) {
    using json = nlohmann::ordered_json;
    if (req.prefill.empty() && req.decode_batches.empty())
        return invalid_argument_error(
            "nothing to measure: --prefill and --decode-batches are both empty");
    for (const int64_t t : req.prefill)
        if (t < 1) return invalid_argument_error("--prefill lengths must be >= 1, got {}", t);
    for (const int64_t b : req.decode_batches)
        if (b < 1) return invalid_argument_error("--decode-batches must be >= 1, got {}", b);
    if (req.prompt_len < 1)
        return invalid_argument_error("--prompt-len must be >= 1, got {}", req.prompt_len);
    if (req.decode_steps < 1)
        return invalid_argument_error("--decode-steps must be >= 1, got {}", req.decode_steps);
    if (req.decode_warmup < 0)
        return invalid_argument_error("--decode-warmup must be >= 0, got {}", req.decode_warmup);
    if (req.prefill_repeats < 1)
        return invalid_argument_error("--prefill-repeats must be >= 1, got {}",
                                      req.prefill_repeats);
    if (req.prefill_chunk < 0)
        return invalid_argument_error("--prefill-chunk must be >= 0, got {}", req.prefill_chunk);
    if (req.kv_block_size < 0 || req.kv_block_size > (1 << 16))
        return invalid_argument_error("--kv-block-size must be in [0, 65536], got {}",
                                      req.kv_block_size);
    if (req.threads < 0)
        return invalid_argument_error("--threads must be >= 0, got {}", req.threads);
    if (req.kernel_breakdown_steps < 0)
        return invalid_argument_error("--kernel-breakdown must be >= 0, got {}",
                                      req.kernel_breakdown_steps);
    LATHE_ASSIGN_OR_RETURN(const ModelConfig config, bench_model_config(req.model, req.vocab_size));
    const int64_t positions = config.max_position_embeddings, V = config.vocab_size;
    const int64_t longest =
        req.prefill.empty() ? 0 : *std::max_element(req.prefill.begin(), req.prefill.end());
    if (longest > positions)
        return invalid_argument_error(
            "--prefill {}: longer than {}'s max_position_embeddings {}; give lengths up to {}",
            longest, req.model, positions, positions);
    const int64_t decode_len =
        req.prompt_len + req.decode_warmup + req.decode_steps + req.kernel_breakdown_steps;
    if (req.max_len < 0 || req.max_len > positions)
        return invalid_argument_error("--max-len {}: give 0 .. {}'s max_position_embeddings {}",
                                      req.max_len, req.model, positions);
    if (!req.decode_batches.empty() && decode_len > positions)
        return invalid_argument_error(
            "--prompt-len {} + {} warm-up + --decode-steps {} + --kernel-breakdown {} = {} "
            "positions, beyond {}'s max_position_embeddings {}",
            req.prompt_len, req.decode_warmup, req.decode_steps, req.kernel_breakdown_steps,
            decode_len, req.model, positions);
    const int64_t largest_batch =
        req.decode_batches.empty()
            ? 0
            : *std::max_element(req.decode_batches.begin(), req.decode_batches.end());
#ifdef _OPENMP
    if (req.threads > 0) omp_set_num_threads(req.threads);
#endif

    const int tp = req.tensor_parallel;
    if (tp < 1) return invalid_argument_error("--tensor-parallel must be >= 1, got {}", tp);
    ProcessGroupInfo group;  // one process, or the launcher's job under tensor parallel
    if (tp > 1) {
        LATHE_ASSIGN_OR_RETURN(group, process_group_from_env(process_environment()));
    }
    LATHE_ASSIGN_OR_RETURN(const BenchPlacement place, bench_placement(req.device, group));
    const bool on_cuda = place.backend == Backend::kCuda;
    if (req.kernel_breakdown_steps > 0 && (!on_cuda || req.decode_batches.empty()))
        return failed_precondition_error(
            "--kernel-breakdown profiles the GPU kernels of decode steps: it takes CUDA and "
            "--decode-batches");
    size_t used_before = 0, free_bytes = 0, total_bytes = 0;
    if (on_cuda && gpu_memory_info(place.ordinal, free_bytes, total_bytes))
        used_before = total_bytes - free_bytes;
    // The processes (inference_processes_open checks T against the job and the model's split
    // before any rank waits on another), or this one alone.
    LATHE_ASSIGN_OR_RETURN(
        InferenceProcesses procs,
        tp > 1 ? inference_processes_open(config, tp, on_cuda ? "cuda" : "cpu", "bench --generate")
               : Result<InferenceProcesses>(InferenceProcesses{}));
    if (tp == 1) {
        LATHE_ASSIGN_OR_RETURN(procs.device,
                               ComputeDevice::open(on_cuda ? "cuda" : "cpu", "--device", group));
    }
    ComputeDevice& device = procs.device;
    Communicator* comm = procs.world ? procs.world->comm.get() : nullptr;
    // The rank's model shape: the local config under tensor parallel (its flops and bytes are the
    // rank's share), the config itself otherwise.
    LATHE_ASSIGN_OR_RETURN(
        const ModelConfig local,
        tp > 1 ? tp_local_config(config, tp, "--tensor-parallel") : Result<ModelConfig>(config));
    const int64_t elem = on_cuda ? 2 : 4;  // bf16 weights and cache on CUDA, f32 on the CPU

    json j;
    j["framework"] = "lathe";
    j["model"] = req.model;
    j["device"] = std::string(backend_name(place.backend));
    j["device_name"] = place.name;
    j["precision"] = on_cuda ? "bf16" : "fp32";
    j["params"] = model_config_num_parameters(config);
    j["flop_params"] = bench_flop_parameters(config);
    j["seed"] = req.seed;
    j["peak_flops"] = place.peak_flops > 0 ? json(place.peak_flops) : json(nullptr);
    j["tensor_parallel"] = tp;

    // The copy bandwidth first, while the device holds nothing of ours.
    std::optional<double> bandwidth;
    if (on_cuda) {
        LATHE_ASSIGN_OR_RETURN(const double bw,
                               copy_bandwidth(device.context(), req.copy_bytes, device));
        bandwidth = bw;
        log_info("bench --generate: device-to-device copy of {}: {:.1f} GB/s (read + write)",
                 format_bytes(req.copy_bytes), bw / 1e9);
    }
    j["copy_bytes"] = on_cuda ? json(req.copy_bytes) : json(nullptr);
    j["copy_bandwidth"] = bandwidth ? json(*bandwidth) : json(nullptr);

    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = 1;
    shape.training = false;
    shape.backend = place.backend;
    const ParamTable table = model_param_table(local);
    LATHE_ASSIGN_OR_RETURN(const MemoryPlan plan, memory_plan_make(local, table, shape));
    // The default chunk: 4096 tokens, at most the longest prompt of the run (the decode
    // prompts' --prompt-len included, so a decode-only run prefills in whole chunks too).
    const int64_t chunk =
        req.prefill_chunk > 0
            ? req.prefill_chunk
            : std::min<int64_t>(4096, std::max<int64_t>({longest, req.prompt_len, 1}));
    EngineLimits prefill_limits;
    prefill_limits.max_sequences = 1;
    prefill_limits.max_len = std::max<int64_t>(longest, 1);
    prefill_limits.prefill_chunk = std::min(chunk, prefill_limits.max_len);
    EngineLimits decode_limits;
    decode_limits.max_sequences = std::max<int64_t>(largest_batch, 1);
    decode_limits.max_len = std::max(decode_len, req.max_len);
    decode_limits.prefill_chunk = std::min(chunk, req.prompt_len);
    decode_limits.kv_block_size = req.kv_block_size;
    decode_limits.cuda_graphs = req.cuda_graphs;
    decode_limits.decode_gemv = req.decode_gemv;
    prefill_limits.peer_reduce = decode_limits.peer_reduce = req.peer_reduce;
    const size_t act = size_t(elem);
    const size_t engine_need =
        std::max(req.prefill.empty() ? 0 : engine_bytes(local, prefill_limits, act),
                 req.decode_batches.empty() ? 0 : engine_bytes(local, decode_limits, act));
    LATHE_RETURN_IF_ERROR(
        check_fits(device, plan.total_bytes() + engine_need,
                   fmt::format("{} (weights {}, KV cache and scratch {})", req.model,
                               format_bytes(plan.total_bytes()), format_bytes(engine_need))));

    log_info("bench --generate: {} ({}) on {}", req.model, model_config_summary(config),
             place.name);
    // Under tensor parallel the rank's shard, uniform from the seed; else Model::init's draws.
    // setup_s: from here until the weights are in the device's memory.
    const auto setup_start = Clock::now();
    LATHE_ASSIGN_OR_RETURN(
        Model model,
        tp > 1 ? tp_model_create_random(config, procs.rank(), tp, shape, device.context(), req.seed)
               : Model::create(config, shape, device.context()));
    if (tp == 1) model.init(req.seed);
    model.synchronize();
    j["setup_s"] = seconds_since(setup_start);
    log_info("bench --generate: model made and its weights drawn in {:.1f} s",
             j["setup_s"].get<double>());
    // Memory in use after each measurement, the largest (bench.h's peak memory, CUDA).
    size_t used_peak = 0;
    const auto sample_memory = [&] {
        if (on_cuda && gpu_memory_info(place.ordinal, free_bytes, total_bytes))
            used_peak = std::max(used_peak, total_bytes - free_bytes);
    };
    std::mt19937_64 gen(req.seed ^ 0x9e3779b97f4a7c15ULL);
    std::vector<float> logits;

    j["prefill_chunk"] = req.prefill.empty() ? json(nullptr) : json(prefill_limits.prefill_chunk);
    j["prefill_repeats"] = req.prefill_repeats;
    json prefill_rows = json::array();
    if (!req.prefill.empty()) {
        LATHE_ASSIGN_OR_RETURN(InferenceEngine engine,
                               InferenceEngine::create(model, prefill_limits, comm));
        logits.assign(size_t(V), 0.0f);
        for (const int64_t T : req.prefill) {
            const std::vector<int32_t> tokens = random_tokens(gen, T, V);
            std::vector<double> times;
            for (int64_t r = 0; r <= req.prefill_repeats; ++r) {  // r = 0: the warm-up
                LATHE_ASSIGN_OR_RETURN(const SeqId seq, engine.open());
                const auto t0 = Clock::now();
                const Status st = engine.prefill(seq, tokens, logits);
                model.synchronize();
                const double s = seconds_since(t0);
                engine.close(seq);
                LATHE_RETURN_IF_ERROR(st);
                if (r > 0) times.push_back(s);
                log_info("bench --generate: prefill {} tokens{}: {:.4f} s", T,
                         r == 0 ? " (warm-up)" : "", s);
            }
            sample_memory();
            const double s = median_of(times);
            const double flops = generate_prefill_flops(local, T);
            json row;
            row["tokens"] = T;
            row["seconds"] = s;
            row["tokens_per_s"] = double(T) / s;
            row["flops"] = flops;
            row["mfu"] = place.peak_flops > 0 ? json(flops / s / place.peak_flops) : json(nullptr);
            prefill_rows.push_back(row);
        }
    }
    j["prefill"] = prefill_rows;

    j["prompt_len"] = req.prompt_len;
    j["kv_block_size"] = req.kv_block_size;
    j["max_len"] = decode_limits.max_len;
    j["cuda_graphs"] = on_cuda && req.kv_block_size > 0 && req.cuda_graphs;
    j["decode_gemv"] = decode_gemv_name(req.decode_gemv);
    j["decode_output"] = req.decode_tokens ? "tokens" : "logits";
    j["peer_reduce"] = false;  // the decode engine's, below
    j["decode_steps"] = req.decode_steps;
    j["decode_warmup"] = req.decode_warmup;
    j["weight_bytes"] = generate_weight_bytes(local, elem);
    j["kv_bytes_per_position"] = generate_kv_bytes_per_position(local, elem);
    json decode_rows = json::array();
    if (!req.decode_batches.empty()) {
        LATHE_ASSIGN_OR_RETURN(InferenceEngine engine,
                               InferenceEngine::create(model, decode_limits, comm));
        j["peer_reduce"] = engine.peer_all_reduce();
        logits.assign(size_t(decode_limits.max_sequences * V), 0.0f);
        for (const int64_t B : req.decode_batches) {
            std::vector<SeqId> seqs;
            for (int64_t b = 0; b < B; ++b) {
                LATHE_ASSIGN_OR_RETURN(const SeqId seq, engine.open());
                seqs.push_back(seq);
                const std::vector<int32_t> prompt = random_tokens(gen, req.prompt_len, V);
                const Status st =
                    engine.prefill(seq, prompt, std::span<float>(logits.data(), size_t(V)));
                if (!st.ok()) {
                    for (const SeqId s : seqs) engine.close(s);
                    return st;
                }
            }
            std::vector<double> times, inputs, forwards, widens;
            double bytes = 0.0;
            std::vector<DecodeStep> steps(static_cast<size_t>(B));
            const std::span<float> out(logits.data(), size_t(B * V));
            std::vector<int32_t> picks(static_cast<size_t>(B));
            // One decode step of the batch with random next tokens, until its logits are back.
            const auto decode_step = [&]() -> Status {
                const std::vector<int32_t> next = random_tokens(gen, B, V);
                for (int64_t b = 0; b < B; ++b)
                    steps[size_t(b)] = {seqs[size_t(b)], next[size_t(b)]};
                const Status done = req.decode_tokens ? engine.decode_greedy(steps, picks)
                                                      : engine.decode(steps, out);
                model.synchronize();
                return done;
            };
            Status st = ok_status();
            for (int64_t k = 0; k < req.decode_warmup + req.decode_steps && st.ok(); ++k) {
                const auto t0 = Clock::now();
                st = decode_step();
                const double s = seconds_since(t0);
                if (k >= req.decode_warmup && st.ok()) {
                    times.push_back(s);
                    const InferenceEngine::DecodeTimes& part = engine.last_decode_times();
                    inputs.push_back(part.inputs);
                    forwards.push_back(part.forward);
                    widens.push_back(part.widen);
                    std::vector<int64_t> lengths;
                    for (const SeqId seq : seqs) lengths.push_back(engine.length(seq));
                    bytes += generate_step_bytes(local, elem, lengths);
                }
            }
            std::optional<KernelBreakdown> kernels;
            if (st.ok() && req.kernel_breakdown_steps > 0) {
                Result<KernelBreakdown> k = bench_kernel_breakdown(
                    req.kernel_breakdown_steps, [&](int64_t) { return decode_step(); },
                    [&] { model.synchronize(); });
                if (k.ok())
                    kernels = std::move(*k);
                else
                    st = k.status();
            }
            sample_memory();
            for (const SeqId seq : seqs) engine.close(seq);
            LATHE_RETURN_IF_ERROR(st);
            const double step_s = median_of(times);
            bytes /= double(req.decode_steps);
            log_info("bench --generate: decode batch {}: {:.3f} ms per step", B, step_s * 1e3);
            json row;
            row["batch"] = B;
            row["tokens_per_step"] = B;
            row["ms_per_step"] = step_s * 1e3;
            row["tokens_per_s"] = double(B) / step_s;
            row["bytes_per_step"] = bytes;
            row["bandwidth_fraction"] =
                bandwidth ? json(bytes / step_s / *bandwidth) : json(nullptr);
            row["inputs_ms"] = median_of(inputs) * 1e3;
            row["forward_ms"] = median_of(forwards) * 1e3;
            row["widen_ms"] = median_of(widens) * 1e3;
            if (kernels)
                row["kernels"] = bench_kernel_breakdown_json(*kernels, req.kernel_breakdown_steps);
            decode_rows.push_back(row);
        }
    }
    j["decode"] = decode_rows;
    if (on_cuda) {
        j["peak_memory_bytes"] = used_peak > used_before ? used_peak - used_before : 0;
        j["peak_memory_source"] = "cuda_mem_get_info";
    } else {
        rusage usage{};
        getrusage(RUSAGE_SELF, &usage);
        j["peak_memory_bytes"] = size_t(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
        j["peak_memory_source"] = "max_rss";
    }
    return procs.rank0() ? j.dump() : std::string();
}

}  // namespace lathe
