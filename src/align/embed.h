#pragma once
// Stage 3 of `lathe align` : token embeddings of one token file, written as GloVe text
// (align/vectors.h). The work of `lathe align embed`, callable from `lathe align run`.
//
//   token file -> vocabulary (min_count) -> GloVe: co-occurrence (CPU, all cores) -> AdaGrad
//                                                  (CUDA, or the CPU Hogwild twin)
//                                        -> SGNS: skip-gram with negative sampling (align/sgns.h)
//              -> "<token id> v1 ... vD" per vocabulary token, most frequent first
//
// Resumable: the output is reused (nothing recomputed) when the token file and every setting
// that changes the result are unchanged (align/stage_cache.h; the manifest sits beside the output).
// Thread count and device are not part of the fingerprint: they change the Hogwild schedule, not
// what is computed.

#include <cstdint>
#include <string>

#include "core/status.h"

namespace lathe {

enum class EmbedMethod { kGlove, kSgns };
enum class EmbedDevice { kAuto, kCpu, kCuda };

struct EmbedOptions {
    std::string tokens;  // token file prefix (PREFIX.bin / PREFIX.idx)
    std::string output;  // vectors, GloVe text
    EmbedMethod method = EmbedMethod::kGlove;
    int64_t dim = 300;
    int window = 0;  // 0: the method's default (GloVe 15 as TokAlign, SGNS 5 as fastText)
    int64_t min_count = 5;
    int iters = 15;           // GloVe iterations / SGNS epochs
    double x_max = 10.0;      // GloVe
    double alpha = 0.75;      // GloVe
    double lr = 0.0;          // 0: the method's default (GloVe 0.05, SGNS 0.05)
    int negative = 5;         // SGNS
    double subsample = 1e-4;  // SGNS
    int threads = 0;          // CPU threads (0: all cores)
    EmbedDevice device = EmbedDevice::kAuto;
    uint64_t seed = 1;
    uint64_t memory_bytes = uint64_t{8} << 30;  // co-occurrence tables, soft
    bool force = false;                         // recompute even when the output is up to date
};

struct EmbedReport {
    bool skipped = false;  // outputs were up to date
    std::string device;    // "cuda (NVIDIA H100 80GB HBM3)", "cpu (16 threads)"
    int64_t documents = 0;
    int64_t corpus_tokens = 0;
    int64_t vocab = 0;           // tokens with vectors (seen >= min_count times)
    int64_t entries = 0;         // GloVe: co-occurrence nonzeros; SGNS: tokens trained per epoch
    double final_cost = 0.0;     // GloVe: mean weighted squared error; SGNS: mean loss
    double count_seconds = 0.0;  // vocabulary + co-occurrence
    double train_seconds = 0.0;
    double write_seconds = 0.0;
    double total_seconds = 0.0;
};

// "glove" / "sgns" and back. Errors name the value and the choices.
const char* embed_method_name(EmbedMethod method);
Result<EmbedMethod> embed_method_from_name(std::string_view name);
Result<EmbedDevice> embed_device_from_name(std::string_view name);

// Runs stage 3 as described above. Errors: the token file is missing or damaged, no token reaches
// min_count, a setting out of range (dim, window, iters, min_count, negative < 1; x_max, alpha,
// lr <= 0), --device cuda in a build without CUDA or on a machine without a GPU, the output
// cannot be written.
Result<EmbedReport> embed_tokens(const EmbedOptions& options);

struct GpuEnvironment;
// Why `env` (gpu_environment_probe) cannot train embeddings on its GPU 0, or "" when it can.
std::string embed_cuda_unusable_reason(const GpuEnvironment& env);

}  // namespace lathe
