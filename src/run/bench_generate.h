#pragma once
// `lathe bench --generate`: inference speed of one model shape through the inference engine
// (infer/engine.h), random weights and random prompts, reported as one JSON line.
//
// The model is a bench preset or a Hugging Face config.json (run/bench.h's bench_model_config),
// created for inference (ModelShape::training false: bf16 compute weights on CUDA, f32 on the
// CPU) and initialised from the seed (Model::init). Two measurements:
//
//   prefill   for each length T of `prefill`: one sequence of T random tokens prefilled into an
//             empty KV cache row (in chunks of prefill_chunk tokens), timed from the call to the
//             last token's logits on the host (the engine returns them, so the device is done);
//             one untimed warm-up prefill of T first, then `prefill_repeats` timed ones, the
//             median reported. One engine of max_len = the longest T serves every length.
//   decode    for each batch B of `decode_batches`: B sequences each prefilled (untimed) with
//             prompt_len random tokens, then decode_warmup untimed and decode_steps timed decode
//             steps of one token per sequence (random next tokens, so no sampling is timed), each
//             timed until its logits are on the host; the median step reported. One engine of
//             max_sequences = the largest B and max_len = prompt_len + decode_warmup +
//             decode_steps + kernel_breakdown_steps (or max_len when larger: the engine of a
//             server whose context is longer than the sequences in it) serves every batch.
//   kernels   with kernel_breakdown_steps N > 0 (CUDA): after a batch's timed steps, N more
//             decode steps of that batch under CUPTI; the batch's row adds "kernels", the
//             fields of run/bench.h's kernel breakdown per decode step (span, busy, gaps: the
//             GPU idle inside the step, the kernel groups and the top kernels).
//
// Tensor parallel (tensor_parallel T > 1, under a launcher of T processes: `lathe launch --gpus
// T lathe bench --generate --tensor-parallel T ...`, or mpirun with --device cpu): every rank
// holds its shard (infer/tensor_parallel.h: tp_local_config, random weights from the seed by
// tp_model_create_random) and runs the same calls with the same random tokens, its engine
// all-reducing over the world as `lathe serve`'s does; rank 0 returns the line, the others an
// empty one. Per GPU: prefill flops and mfu are the rank's share (prefill_flops of the local
// config: H/T heads, the body over T, the replicated LM head), decode bytes_per_step and
// bandwidth_fraction the rank's (W and K of the local config); the kernel breakdown is rank 0's.
//
// Definitions (bench/generate_baseline.py reports the same keys for transformers):
//   prefill_flops(T) = 2 N_body T + 2 V C + 2 L H D T (T + 1)
//                      N_body: the parameters a token's forward multiplies by (bench.h's
//                      flop parameters less the LM head's V C); the LM head runs on the last
//                      token only (its logits are all a prefill returns); the last term is the
//                      causal attention, QK^T and PV, 2 D FLOPs per (query, key) pair each, over
//                      the T (T + 1) / 2 pairs of a causal T x T, per layer and query head.
//   prefill mfu      = prefill_flops(T) / seconds / peak (989.4e12 on Hopper, bench.h's
//                      bench_peak_flops); null where there is no agreed peak (the CPU).
//   decode bytes_per_step = W + sum over the B sequences of (their length after the step) * K,
//                      averaged over the timed steps: W = the flop parameters (blocks, final norm,
//                      LM head) times the weights' element size (bf16 on CUDA, f32 on the CPU),
//                      K = 2 L Hkv D times the cache's element size: the bytes of weights and
//                      KV cache one step reads (token embedding rows and the cache writes left
//                      out).
//   copy_bandwidth   bytes/s of a device-to-device copy of copy_bytes (a large buffer), counting
//                      the bytes read and the bytes written (2 x copy_bytes per copy), the best
//                      of a few copies after a warm-up one, measured in the same process before
//                      the model exists; null on the CPU.
//   bandwidth_fraction = bytes_per_step / (ms_per_step / 1e3) / copy_bandwidth: how close a step
//                      comes to the time reading its bytes at the copy's speed takes; null on the
//                      CPU.
//   decode tokens_per_s = B / median step seconds; tokens_per_step = B.
//   inputs_ms, forward_ms, widen_ms (lathe only): the medians over the timed steps of the engine's
//                      DecodeTimes (infer/engine.h): the call up to the forward, the forward
//                      until the logits are in host memory, their widening to f32. The step's
//                      time less the three is the bench's own (the random tokens, the sync).
//
// Memory: before each engine is made, the weights (the model's plan) plus the KV cache and the
// engine's scratch are checked against the device's free memory; too little is an error that
// says how much is needed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "infer/engine.h"
#include "model/model_config.h"
#include "run/bench.h"

namespace lathe {

struct GenerateBenchRequest {
    std::string model;  // a preset name, or a config.json file / a folder holding one
    std::optional<int64_t> vocab_size;
    std::vector<int64_t> prefill{4096, 32768};       // prefill lengths T (may be empty)
    std::vector<int64_t> decode_batches{1, 16, 64};  // decode batches B (may be empty)
    int64_t prompt_len = 1024;                       // tokens each decode sequence starts with
    int64_t max_len = 0;  // the decode engine's max_len when above what the steps need (above)
    int64_t decode_steps = 64;    // timed decode steps per batch
    int64_t decode_warmup = 4;    // untimed decode steps before them
    int64_t prefill_repeats = 3;  // timed prefills per length
    int64_t prefill_chunk = 0;    // tokens per prefill forward; 0 = min(4096, longest prefill)
    // The decode engine's KV cache: 0 = rows of max_len, > 0 = paged in blocks of this many
    // positions (infer/paged_kv_cache.h); cuda_graphs replays the paged CUDA decode step from CUDA
    // graphs (infer/engine.h; no effect with rows or on the CPU).
    int64_t kv_block_size = 0;
    bool cuda_graphs = true;
    // The decode engine's GEMM for few rows (infer/engine.h, DecodeGemv; --decode-gemv).
    DecodeGemv decode_gemv = DecodeGemv::kOff;
    // Tensor parallel on CUDA: small sums through PeerAllReduce (infer/engine.h, PeerReduce); the
    // line's peer_reduce says whether the decode engine used it.
    PeerReduce peer_reduce = PeerReduce::kAuto;
    int64_t kernel_breakdown_steps = 0;   // profiled decode steps per batch (kernels above)
    size_t copy_bytes = size_t(1) << 30;  // the bandwidth copy's size (CUDA)
    BenchDevice device = BenchDevice::kAuto;
    int tensor_parallel = 1;  // T ranks, each its shard (above)
    uint64_t seed = 1234;
    int threads = 0;  // CPU: OpenMP threads, 0 = all cores
};

// prefill_flops(T) above.
double generate_prefill_flops(const ModelConfig& config, int64_t tokens);
// The bytes of weights one decode step reads (W above), for weights of `weight_bytes` per element.
double generate_weight_bytes(const ModelConfig& config, int64_t weight_bytes);
// The bytes of keys and values one position of one sequence holds over all layers (K above).
double generate_kv_bytes_per_position(const ModelConfig& config, int64_t cache_bytes);
// W + K * sum(lengths): the bytes a decode step reads when its sequences have `lengths`
// positions after the step.
double generate_step_bytes(const ModelConfig& config, int64_t element_bytes,
                           const std::vector<int64_t>& lengths);

// Parses a comma-separated list of positive integers ("4096,32768") for `flag`; an empty text
// is an empty list. Errors name the flag and the bad item.
Result<std::vector<int64_t>> parse_length_list(const std::string& text, std::string_view flag);

// Runs the benchmark and returns its JSON line (no newline); progress goes to stderr.
// Errors: an empty request (no prefill length and no decode batch), lengths, batches or counts
// below 1, a prefill length or prompt_len + steps beyond the model's max_position_embeddings,
// --device cuda without a usable GPU, memory the device lacks (with the bytes needed), model or
// engine creation failures.
Result<std::string> bench_generate_run(const GenerateBenchRequest& request);

}  // namespace lathe
