#pragma once
// FP8 training's settings and scaling state: what the config's fp8.* keys choose
// (run/train_settings.h reads them), the precision policy built from them (which linear roles run
// their GEMMs in fp8, model/precision_policy.h), and the delayed-scaling state the block schedule
// reads its scales from and records each cast's amax into.
//
// Recipes (ops/fp8_cast.h has the casts' math):
//   tensorwise  one scale per tensor from the tensor's own amax (current scaling): no state.
//   delayed     one scale per tensor from an amax history, Transformer Engine's DelayedScaling:
//               the cast of step s uses scale_s = fp8_max / max(R(history), kFp8AmaxFloor) where
//               R is the max (or the most recent entry) of the last `amax_history` amaxes the
//               casts reported, and records this step's amax. A tensor whose R is 0 (never seen)
//               or not finite keeps its scale (1 at the start). The state is part of a
//               checkpoint, so a resumed run computes the same scales bit for bit.
//   blockwise   DeepSeek-V3: 1 x 128 groups of activations and gradients, 128 x 128 blocks of
//               weights, E4M3 everywhere (fp8.grad_format must be e4m3), f32 scales; no state.
// Linear roles in FP8: qkv, attn_out, mlp_up, mlp_down; the LM head with fp8.lm_head: true.
// Attention, norms and embeddings stay bf16; master weights and moments f32.
//
// Scaled tensors of the delayed state: three per FP8 linear of each layer (its input x, its
// weight w, the gradient dy of its output; six linears a layer: q, k, v, the attention output,
// the MLP's up (gate and up stacked) and down), in the order fp8_tensor_index gives, then the LM
// head's three when it is FP8.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/precision_policy.h"

namespace lathe {

enum class Fp8Recipe : uint8_t { kTensorwise, kDelayed, kBlockwise };
enum class Fp8AmaxReduction : uint8_t { kMax, kMostRecent };

// "tensorwise", "delayed", "blockwise" / "max", "most_recent".
std::string_view fp8_recipe_name(Fp8Recipe r);
std::string_view fp8_amax_reduction_name(Fp8AmaxReduction r);

struct Fp8Settings {
    Fp8Recipe recipe = Fp8Recipe::kTensorwise;
    DType grad_dtype = DType::kE5M2;  // fp8.grad_format: the dtype of dy's casts (auto: E5M2,
                                      // E4M3 for blockwise)
    bool lm_head = false;             // fp8.lm_head
    int amax_history = 16;            // fp8.amax_history (delayed)
    Fp8AmaxReduction amax_reduction = Fp8AmaxReduction::kMax;  // fp8.amax_reduction (delayed)

    bool operator==(const Fp8Settings&) const = default;
};

// The largest amax history fp8.amax_history accepts.
inline constexpr int kFp8MaxAmaxHistory = 4096;

// Parses the fp8.* values (as the config holds them) into settings, checking each and their
// combination; `source` names where a key's value came from (the config file and line, --set)
// for the message, which names the key, the value and what to write instead.
Result<Fp8Settings> fp8_settings_parse(std::string_view recipe, std::string_view grad_format,
                                       bool lm_head, int64_t amax_history,
                                       std::string_view amax_reduction,
                                       const std::function<std::string(std::string_view)>& source);
// The same with one source for every key (a command-line flag, a test).
inline Result<Fp8Settings> fp8_settings_parse(std::string_view recipe, std::string_view grad_format,
                                              bool lm_head, int64_t amax_history,
                                              std::string_view amax_reduction,
                                              std::string_view source) {
    return fp8_settings_parse(recipe, grad_format, lm_head, amax_history, amax_reduction,
                              [source](std::string_view) { return std::string(source); });
}

// The policy of an FP8 run: the four block roles (and the LM head with lm_head) at
// kFp8PerTensor (tensorwise, delayed) or kFp8Blockwise; everything else kNative.
PrecisionPolicy fp8_precision_policy(const Fp8Settings& s);

// The FP8 linears of a block, as the block schedule calls them (model/block.cpp): q, k and v are
// one GEMM over their stacked weight (one scale for the three, as Megatron-LM's fused QKV linear
// under Transformer Engine), the gated MLP's gate and up one stacked GEMM.
enum class Fp8Linear : uint8_t { kQkv, kAttnOut, kMlpUp, kMlpDown };
inline constexpr int64_t kFp8LinearsPerLayer = 4;

// "qkv", "attn_out", "mlp_up", "mlp_down".
constexpr std::string_view fp8_linear_name(Fp8Linear l) {
    constexpr std::string_view kNames[] = {"qkv", "attn_out", "mlp_up", "mlp_down"};
    return kNames[size_t(l)];
}

// The role whose spec an FP8 linear gets (model/precision_policy.h).
constexpr LinearRole fp8_linear_role(Fp8Linear l) {
    switch (l) {
        case Fp8Linear::kQkv:
            return LinearRole::kQkv;
        case Fp8Linear::kAttnOut:
            return LinearRole::kAttnOut;
        case Fp8Linear::kMlpUp:
            return LinearRole::kMlpUp;
        case Fp8Linear::kMlpDown:
            return LinearRole::kMlpDown;
    }
    return LinearRole::kQkv;
}

// Which scaled tensor of an FP8 linear.
enum class Fp8Tensor : uint8_t { kInput, kWeight, kGradOutput };

// The index of a scaled tensor in the delayed state (see the file comment). `layers` is the
// model's layer count.
int64_t fp8_tensor_index(int64_t layers, int64_t layer, Fp8Linear linear, Fp8Tensor t);
// The LM head's three, after the layers' (with fp8.lm_head).
int64_t fp8_head_tensor_index(int64_t layers, Fp8Tensor t);
// How many scaled tensors a model of `layers` layers has under `s`.
int64_t fp8_tensor_count(int64_t layers, const Fp8Settings& s);

// The delayed-scaling state: per scaled tensor an amax history (a ring of `history` entries) and
// the scale the next casts use. Host memory: the block schedule copies scales to the device once
// per optimizer step and the casts' amaxes back (fp8 weight copies are made once per step too).
class Fp8ScalingState {
public:
    Fp8ScalingState() = default;
    // `dtypes[t]`: the fp8 dtype tensor t is cast to (its fp8_max).
    Fp8ScalingState(std::vector<DType> dtypes, int history, Fp8AmaxReduction reduction);

    int64_t tensors() const { return int64_t(dtypes_.size()); }
    int history() const { return history_; }
    float scale(int64_t t) const { return scale_[size_t(t)]; }
    const std::vector<float>& scales() const { return scale_; }
    // The newest entry of tensor t's history (this step's amax once recorded).
    float newest_amax(int64_t t) const;

    // The amax a cast of tensor t reported in this step: the step's entry keeps the largest
    // (several micro-batches cast the same tensor).
    void record(int64_t t, float amax);
    // At the end of an optimizer step: every scale from its history (file comment), then the
    // ring moves on and the new step's entry starts at 0.
    void update();

    // Saves to / loads from a JSON file (values as their f32 bit patterns, so a load gives the
    // same bits). save writes under a temporary name and renames. load checks that the file
    // holds a state of the same tensor count, dtypes, history and reduction as this one,
    // naming the file and what differs.
    Status save(const std::string& path) const;
    Status load(const std::string& path);

    bool operator==(const Fp8ScalingState&) const = default;

private:
    std::vector<DType> dtypes_;
    int history_ = 1;
    Fp8AmaxReduction reduction_ = Fp8AmaxReduction::kMax;
    int64_t position_ = 0;      // the ring entry of the current step
    std::vector<float> amax_;   // (tensors, history)
    std::vector<float> scale_;  // (tensors)
};

// FP8 GEMMs run in the current step (forward, input and weight gradients of every FP8 linear,
// each micro-batch): the metrics' proof that a run trained in FP8.
struct Fp8GemmCounter {
    int64_t step_gemms = 0;
    void add(int64_t n) { step_gemms += n; }
    // The count of the step that ends, and a new step starts at 0.
    int64_t take() {
        const int64_t n = step_gemms;
        step_gemms = 0;
        return n;
    }
};

// FP8 GEMMs one optimizer step runs: 3 per FP8 linear per micro-batch (forward, dx, dW), six
// linears a layer plus the head with fp8.lm_head.
int64_t fp8_gemms_per_step(int64_t layers, const Fp8Settings& s, int64_t micro_batches);
// The same when the backward runs each layer's forward again (full activation recompute,
// memory_plan.h): one more forward GEMM per block linear per micro-batch.
int64_t fp8_gemms_per_step(int64_t layers, const Fp8Settings& s, int64_t micro_batches,
                           bool full_recompute);

}  // namespace lathe
