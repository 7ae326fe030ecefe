// `lathe bench --model NAME --batch B --seq T [--steps N] [--warmup W] [--device auto|cpu|cuda]`:
// see run/bench.h. `lathe bench --generate [--preset P | --config F] [--prefill 4096,32768]
// [--decode-batches 1,16,64] [--prompt-len 1024] [--decode-steps N]`: inference speed, see
// run/bench_generate.h. The JSON line goes to stdout, progress to stderr.
#include "run/bench.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cli/command.h"
#include "io/file.h"
#include "run/bench_generate.h"

namespace lathe {

void cli_add_bench(CLI::App& parent, CommandAction& action) {
    std::string presets;
    for (const BenchPreset& p : bench_model_presets())
        presets += "\n  " + std::string(p.name) + ": " + std::string(p.description);
    CLI::App* cmd = parent.add_subcommand(
        "bench",
        "Measure training throughput of a model shape on random data (tokens/s, step time, MFU, "
        "memory); one JSON line");
    cmd->footer(
        "Random init, random token batches, W warmup then N timed steps of what `lathe train` "
        "runs per step (forward+backward, grad norm, clip, AdamW), each timed until the device is "
        "done. JSON: tokens_per_s (K*B*T / median step, K = --accum), step_ms_median/mean/min/max, "
        "s_per_it (the median step in seconds), mfu "
        "((6N + 12 L C T) FLOPs per token, N without the input embedding tables, over 989.4 "
        "TFLOP/s on Hopper; null elsewhere), peak_memory_bytes (CUDA: cudaMemGetInfo in use "
        "after each step minus before the bench; CPU: peak resident set), plan_bytes, params. "
        "Under a launcher (lathe launch --gpus N lathe bench ...) the ranks train one model "
        "data parallel (--zero-stage) and rank 0 prints the line: tokens_per_s of the world, "
        "tokens_per_s_per_gpu, mfu per GPU, comm_wait_ms (median per step, the largest rank's), "
        "peak memory of the fullest GPU, world_size. --precision fp8 runs the block's linears in "
        "fp8 (train.precision fp8) with the same fields, plus fp8_recipe, fp8_gemms_per_step and "
        "fp8_weight_casts_per_step; --fp8-lm-head puts the LM head's GEMMs in fp8 too "
        "(fp8.lm_head: true) and adds fp8_lm_head.\n\n"
        "--generate measures inference through the engine of `lathe generate` and `lathe serve` "
        "instead (random weights, bf16 on CUDA): per --prefill length T, one sequence's prefill "
        "time (median of --prefill-repeats after a warm-up), tokens/s and mfu = (2 N_body T + "
        "2 V C + 2 L H D T (T+1)) / seconds / 989.4 TFLOP/s (N_body: the flop parameters "
        "without the LM head, which runs on the last token; the last term is the causal "
        "attention); per --decode-batches B, after B prompts of --prompt-len tokens: ms per "
        "decode step (median), tokens/s (B per step), bytes_per_step (weights + the KV cache at "
        "the sequences' lengths) and bandwidth_fraction = bytes_per_step / step time / the "
        "copy_bandwidth of a device-to-device copy (reads + writes) measured first (null on the "
        "CPU). --model, --preset or --config names the model (presets: llama3-8b for the "
        "Llama-3-8B shape).");
    struct Options {
        std::string model, device = "auto";
        BenchRequest req;
        int64_t vocab = 0;
        std::string recompute;
        std::string precision = "bf16", fp8_recipe = "tensorwise";
        bool fp8_lm_head = false;
        std::string offload = "none", state_dtype = "fp32", offload_schedule = "overlapped",
                    optimizer_schedule = "serial";
        int optimizer_sms = 0;
        std::string gemm_search = "on";
        std::string preset, config;  // --model's two spellings
        bool generate = false;
        GenerateBenchRequest gen;
        std::string prefill = "4096,32768", decode_batches = "1,16,64";
        std::string decode_gemv = "auto";
        std::string decode_output = "logits";
        std::string peer_reduce = "auto";
        int tensor_parallel = 1;
    };
    auto o = std::make_shared<Options>();
    cmd->add_option("--model", o->model,
                    "A preset, or a Hugging Face config.json (file or folder). Presets:" + presets);
    cmd->add_option("--preset", o->preset, "A preset (as --model)");
    cmd->add_option("--config", o->config,
                    "A Hugging Face config.json, file or folder (as --model)");
    cmd->add_option("--batch", o->req.batch, "Sequences per step (B; training)");
    cmd->add_option("--seq", o->req.seq, "Tokens per sequence (T; training)");
    cmd->add_flag("--generate", o->generate,
                  "Measure inference (prefill and decode through the inference engine) instead "
                  "of training");
    cmd->add_option("--prefill", o->prefill,
                    "--generate: prefill lengths, comma-separated; empty for none")
        ->capture_default_str();
    cmd->add_option("--decode-batches", o->decode_batches,
                    "--generate: decode batch sizes, comma-separated; empty for none")
        ->capture_default_str();
    cmd->add_option("--prompt-len", o->gen.prompt_len,
                    "--generate: tokens each decode sequence is prefilled with first")
        ->capture_default_str();
    cmd->add_option("--max-len", o->gen.max_len,
                    "--generate: the decode engine's tokens per sequence (KV cache, block tables, "
                    "attention plan) when more than --prompt-len and the steps need, as a server "
                    "of a longer context holds them; 0 = what they need")
        ->capture_default_str();
    cmd->add_option("--decode-steps", o->gen.decode_steps, "--generate: timed decode steps")
        ->capture_default_str();
    cmd->add_option("--decode-warmup", o->gen.decode_warmup,
                    "--generate: untimed decode steps before them")
        ->capture_default_str();
    cmd->add_option("--prefill-repeats", o->gen.prefill_repeats,
                    "--generate: timed prefills per length (after one warm-up)")
        ->capture_default_str();
    cmd->add_option("--prefill-chunk", o->gen.prefill_chunk,
                    "--generate: tokens per prefill forward; 0 = min(4096, longest prefill)")
        ->capture_default_str();
    cmd->add_option("--kv-block-size", o->gen.kv_block_size,
                    "--generate: decode KV cache paged in blocks of this many positions; 0 = "
                    "one row of max_len per sequence")
        ->capture_default_str();
    cmd->add_option("--decode-output", o->decode_output,
                    "--generate: what a decode step returns: logits (every row's, widened on the "
                    "host) or tokens (every row's greedy pick, made where the logits are)")
        ->check(CLI::IsMember({"logits", "tokens"}))
        ->capture_default_str();
    cmd->add_option("--cuda-graphs", o->gen.cuda_graphs,
                    "--generate: 1 = replay the paged CUDA decode step from CUDA graphs (with "
                    "--kv-block-size > 0), 0 = launch its kernels one by one")
        ->capture_default_str();
    cmd->add_option("--accum", o->req.accum,
                    "Micro-batches of --batch sequences per step (gradient accumulation, as "
                    "train.gradient_accumulation_steps)")
        ->capture_default_str();
    cli_add_decode_gemv(cmd, o->decode_gemv, "--generate: ");
    cli_add_peer_reduce(cmd, o->peer_reduce, "--generate: ");
    cmd->add_option("--tensor-parallel", o->tensor_parallel,
                    "--generate: T ranks each hold a shard of the model (one process per GPU: "
                    "lathe launch --gpus T lathe bench --generate --tensor-parallel T ...); the "
                    "line is rank 0's, flops, mfu and bytes per GPU")
        ->capture_default_str();
    cmd->add_option("--steps", o->req.steps, "Timed steps")->capture_default_str();
    cmd->add_option("--warmup", o->req.warmup, "Untimed steps before them")->capture_default_str();
    cmd->add_option("--device", o->device, "auto (the GPU when there is a usable one), cpu, cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->add_option("--vocab-size", o->vocab,
                    "Override the model's vocabulary (e.g. 50304, GPT-2's padded size that "
                    "torch_baseline.py uses)");
    cmd->add_option("--seed", o->req.seed, "Seed of the parameters and the batches")
        ->capture_default_str();
    cmd->add_option("--threads", o->req.threads, "CPU threads (OpenMP); 0 = all cores")
        ->capture_default_str()
        ->check(kThreadsRange);
    cmd->add_flag(
        "--nondeterministic", o->req.nondeterministic,
        "Let the GPU use its faster nondeterministic kernels, as train.deterministic: false "
        "(the attention backward's dQ by atomics, as PyTorch's flash attention)");
    // Given bare, --recompute means full: the mode that keeps the least.
    cmd->add_option(
           "--recompute", o->recompute,
           "Activation recompute, as train.recompute: none, selective (norm and activation "
           "outputs recomputed), full (one layer's activations kept); bare: full")
        ->expected(0, 1);
    cmd->add_option("--zero-stage", o->req.zero_stage,
                    "Under a launcher (lathe launch --gpus N lathe bench ...): parallel.zero_stage "
                    "of the ranks' data parallelism (0 replicated, 1 sharded optimizer state, 2 "
                    "and gradients, 3 and parameters)")
        ->capture_default_str();
    cmd->add_option("--precision", o->precision,
                    "bf16 (the CUDA backend's; the CPU computes in fp32), or fp8: the block's "
                    "linears in fp8 (--fp8-recipe), as train.precision fp8, on a GPU with FP8 "
                    "tensor cores")
        ->capture_default_str()
        ->check(CLI::IsMember({"bf16", "fp8"}));
    cmd->add_option("--fp8-recipe", o->fp8_recipe,
                    "With --precision fp8: tensorwise, delayed or blockwise (fp8.recipe; "
                    "blockwise with E4M3 gradients)")
        ->capture_default_str()
        ->check(CLI::IsMember({"tensorwise", "delayed", "blockwise"}));
    cmd->add_flag("--fp8-lm-head", o->fp8_lm_head,
                  "With --precision fp8 (tensorwise or delayed): the LM head's GEMMs in fp8 too, "
                  "as fp8.lm_head: true");
    cmd->add_option("--offload", o->offload,
                    "none, or cpu: the f32 masters and AdamW moments in pinned host memory, "
                    "stepped by the CPU AdamW, as optimizer.offload: cpu (one process)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "cpu"}));
    cmd->add_option("--offload-schedule", o->offload_schedule,
                    "With --offload cpu: overlapped (gradient copies during the backward, the "
                    "CPU update while the next forward waits per layer), serial, or delayed "
                    "(the update runs during the next step, which uses the weights before it; "
                    "with --offload-fraction 1) (optimizer.offload_schedule)")
        ->capture_default_str()
        ->check(CLI::IsMember({"overlapped", "serial", "delayed"}));
    cmd->add_option(
           "--offload-fraction", o->req.offload_fraction,
           "With --offload cpu: the fraction of the parameters offloaded, in (0, 1] "
           "(optimizer.offload_fraction): the last units first (an untied LM head, then the "
           "last layers); the "
           "rest keeps its masters and moments on the device")
        ->capture_default_str();
    cmd->add_option("--optimizer-schedule", o->optimizer_schedule,
                    "Without --offload: serial (the device AdamW between the backward and the "
                    "next forward) or overlapped (unit by unit on a low-priority stream while the "
                    "next forward waits per unit), as optimizer.schedule")
        ->capture_default_str()
        ->check(CLI::IsMember({"serial", "overlapped"}));
    cmd->add_option("--optimizer-sms", o->optimizer_sms,
                    "With --optimizer-schedule overlapped on CUDA: the SMs the forward's GEMMs "
                    "leave to the update beside them, as optimizer.overlap_sms (0: none)")
        ->capture_default_str();
    cmd->add_option("--gemm-search", o->gemm_search,
                    "On CUDA: on (each GEMM problem met first times cuBLASLt's candidates and "
                    "keeps the fastest with the same bits) or off (the heuristic's first)")
        ->capture_default_str()
        ->check(CLI::IsMember({"on", "off"}));
    cmd->add_option("--lm-head-rows", o->req.lm_head_rows,
                    "Rows of logits the fused LM head computes at once (0: the largest count "
                    "whose f32 chunk fits the plan's budget, 512 MiB on CUDA, 2 GiB with "
                    "--fp8-lm-head); fewer rows take less memory, more rows fewer weight-gradient "
                    "passes")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--state-dtype", o->state_dtype,
                    "The AdamW moments' storage, fp32 or bf16 (optimizer.state_dtype; with "
                    "--offload cpu the host's)")
        ->capture_default_str()
        ->check(CLI::IsMember({"fp32", "bf16"}));
    cmd->add_option("--kernel-breakdown", o->req.kernel_breakdown_steps,
                    "CUDA: after the timed steps, run this many more under CUPTI and add the "
                    "kernel time per group (GEMMs, attention, norms, ...) and the GPU's idle "
                    "time per step to the line (ops/kernel_groups.h); with --generate, decode "
                    "steps per --decode-batches batch, in each batch's row; 0 = off")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--kernel-trace", o->req.kernel_trace,
                    "With --kernel-breakdown N (training): write the N steps' kernels, copies and "
                    "sets to this file as a Chrome trace (one track per CUDA stream; Perfetto or "
                    "chrome://tracing open it)");
    cmd->add_flag("--plan-only", o->req.plan_only,
                  "Print the parameter count, FLOPs per token and the memory plan; run nothing");
    cmd->add_option("--plan-ranks", o->req.plan_ranks,
                    "With --plan-only: the memory plan of one rank of this many data-parallel "
                    "ranks at --zero-stage")
        ->capture_default_str();
    cmd->add_option("--plan-tensor", o->req.plan_tensor,
                    "With --plan-only: the ranks form tensor-parallel groups of this many "
                    "(parallel.tensor; it divides --plan-ranks), the rest data parallel")
        ->capture_default_str();
    cmd->add_option("--plan-sequence-parallel", o->req.plan_sequence_parallel,
                    "With --plan-tensor: parallel.sequence_parallel (1: each tensor rank keeps "
                    "1/T of the residual stream's rows, as lathe train does by default; 0: off)")
        ->capture_default_str();
    cmd->callback([o, cmd, &action] {
        action = [o, cmd]() -> Status {
            const size_t named =
                cmd->count("--model") + cmd->count("--preset") + cmd->count("--config");
            if (named != 1)
                return invalid_argument_error(
                    "lathe bench: name the model with exactly one of --model, --preset and "
                    "--config (got {})",
                    named);
            if (cmd->count("--preset") > 0) {
                bool known = false;
                for (const BenchPreset& p : bench_model_presets()) known |= p.name == o->preset;
                if (!known)
                    return invalid_argument_error(
                        "--preset '{}' is not a preset; see `lathe bench --help` for the list, or "
                        "pass a config.json with --config",
                        o->preset);
            }
            if (cmd->count("--config") > 0 && !file_exists(o->config))
                return not_found_error("--config {}: no such file or folder", o->config);
            const std::string model = cmd->count("--preset") > 0   ? o->preset
                                      : cmd->count("--config") > 0 ? o->config
                                                                   : o->model;
            const BenchDevice device = o->device == "cpu"    ? BenchDevice::kCpu
                                       : o->device == "cuda" ? BenchDevice::kCuda
                                                             : BenchDevice::kAuto;
            if (o->generate) {
                for (const char* training : {"--batch",
                                             "--seq",
                                             "--accum",
                                             "--steps",
                                             "--warmup",
                                             "--recompute",
                                             "--zero-stage",
                                             "--precision",
                                             "--fp8-recipe",
                                             "--fp8-lm-head",
                                             "--lm-head-rows",
                                             "--plan-only",
                                             "--nondeterministic",
                                             "--offload",
                                             "--state-dtype",
                                             "--offload-schedule",
                                             "--offload-fraction",
                                             "--plan-ranks",
                                             "--plan-tensor",
                                             "--plan-sequence-parallel",
                                             "--optimizer-schedule",
                                             "--optimizer-sms",
                                             "--kernel-trace"})
                    if (cmd->count(training) > 0)
                        return invalid_argument_error(
                            "{} is a training bench option; --generate takes --prefill, "
                            "--decode-batches, --prompt-len, --decode-steps (see --help)",
                            training);
                GenerateBenchRequest g = o->gen;
                g.model = model;
                g.device = device;
                g.seed = o->req.seed;
                g.threads = o->req.threads;
                if (cmd->count("--vocab-size") > 0) g.vocab_size = o->vocab;
                g.kernel_breakdown_steps = o->req.kernel_breakdown_steps;
                LATHE_ASSIGN_OR_RETURN(g.decode_gemv,
                                       decode_gemv_parse(o->decode_gemv, "--decode-gemv"));
                LATHE_ASSIGN_OR_RETURN(g.peer_reduce,
                                       peer_reduce_parse(o->peer_reduce, "--peer-reduce"));
                LATHE_ASSIGN_OR_RETURN(g.prefill, parse_length_list(o->prefill, "--prefill"));
                LATHE_ASSIGN_OR_RETURN(g.decode_batches,
                                       parse_length_list(o->decode_batches, "--decode-batches"));
                g.tensor_parallel = o->tensor_parallel;
                g.decode_tokens = o->decode_output == "tokens";
                LATHE_ASSIGN_OR_RETURN(const std::string line, bench_generate_run(g));
                if (!line.empty()) std::printf("%s\n", line.c_str());  // rank 0's alone
                std::fflush(stdout);
                return ok_status();
            }
            for (const char* inference :
                 {"--prefill", "--decode-batches", "--prompt-len", "--decode-steps",
                  "--decode-output", "--decode-warmup", "--prefill-repeats", "--prefill-chunk",
                  "--tensor-parallel", "--max-len", "--peer-reduce", "--decode-gemv"})
                if (cmd->count(inference) > 0)
                    return invalid_argument_error("{} needs --generate", inference);
            for (const char* needed : {"--batch", "--seq"})
                if (cmd->count(needed) == 0)
                    return invalid_argument_error(
                        "lathe bench: {} is required (or --generate for inference)", needed);
            BenchRequest req = o->req;
            req.model = model;
            req.device = device;
            if (cmd->count("--vocab-size") > 0) req.vocab_size = o->vocab;
            if (cmd->count("--recompute") > 0) {
                const std::string name = o->recompute.empty() ? "full" : o->recompute;
                const std::optional<Recompute> mode = recompute_from_name(name);
                if (!mode)
                    return invalid_argument_error(
                        "--recompute is '{}'; choose none, selective or full", name);
                req.recompute = *mode;
            }
            if (o->precision == "fp8") {
                LATHE_ASSIGN_OR_RETURN(
                    req.fp8, fp8_settings_parse(o->fp8_recipe, "auto", o->fp8_lm_head, 16, "max",
                                                "--fp8-recipe"));
            } else if (cmd->count("--fp8-recipe") > 0) {
                return invalid_argument_error(
                    "--fp8-recipe {} without --precision fp8: add --precision fp8", o->fp8_recipe);
            } else if (o->fp8_lm_head) {
                return invalid_argument_error(
                    "--fp8-lm-head without --precision fp8: add --precision fp8");
            }
            req.offload = o->offload == "cpu" ? OptimizerOffload::kCpu : OptimizerOffload::kNone;
            req.state_dtype =
                o->state_dtype == "bf16" ? AdamWStateDType::kBF16 : AdamWStateDType::kF32;
            if (cmd->count("--offload-schedule") > 0 && req.offload != OptimizerOffload::kCpu)
                return invalid_argument_error("--offload-schedule {} needs --offload cpu",
                                              o->offload_schedule);
            req.offload_schedule = o->offload_schedule == "serial" ? OffloadSchedule::kSerial
                                   : o->offload_schedule == "delayed"
                                       ? OffloadSchedule::kDelayed
                                       : OffloadSchedule::kOverlapped;
            req.optimizer_schedule = o->optimizer_schedule == "overlapped"
                                         ? OptimizerSchedule::kOverlapped
                                         : OptimizerSchedule::kSerial;
            req.optimizer_sms = o->optimizer_sms;
            req.gemm_search = o->gemm_search == "on";
            LATHE_ASSIGN_OR_RETURN(const std::string line, bench_run(req));
            if (!line.empty()) {  // empty on the ranks other than 0 of a launcher's world
                std::printf("%s\n", line.c_str());
                std::fflush(stdout);
            }
            return ok_status();
        };
    });
}

}  // namespace lathe
