#pragma once
// Linear layer with Hugging Face's weight layout [out, in] (nn.Linear), optional bias.
//   y[n, o] = sum_i x[n, i] * weight[o, i] + bias[o]           (y = x W^T + b)
// Backward:
//   dx = dy W            dweight += dy^T x            dbias += sum_n dy[n, :]
// Shapes: x, dx (N, I) (leading dims flattened) | y, dy (N, O) | weight, dweight (O, I) |
//   bias, dbias (O) or null (no bias). Fused projections are one linear over stacked weights:
//   q/k/v (O = (H + 2 Hkv) D) and gate/up (O = 2F) stack row blocks, which is how an arena holding
//   HF's separate [out, in] tensors next to each other lays them out anyway.
// Dtypes: CPU f32 (sgemm from BLAS when the build has it, plain loops otherwise).
//   CUDA: bf16 x, y, weight (cuBLASLt, bias epilogue), f32 accumulation.
// Gradients: dx per `dx_mode` (= or +=), null when the input needs none; dweight per
//   LinearSpec::dweight_mode (+= by default, = for the step's first contribution), dbias
//   accumulates (+=); both null when frozen.
// Deterministic for a given BLAS build, whatever the thread count (dbias: fp64 row sums in order).
//
// The GELU MLP's projections as one op each (the CUDA backend computes the tanh GELU in the up
// projection's GEMM epilogue, ops/cuda/linear.h; the CPU runs the separate ops, bit for bit as
// the unfused sequence):
//   linear_gelu_forward:  pre = x W^T + b;  act = gelu(pre)
//       = linear_forward(pre, x, W, b) then gelu_forward(act, pre).
//   linear_gelu_backward, for the projection y = act W^T + b that reads act = gelu(pre):
//       dpre = gelu'(pre) * (dy W)  (=)        dweight += dy^T act        dbias += sum_n dy[n, :]
//       dpre_bias += sum_n dpre[n, :]           (the bias gradient of the linear that made pre)
//       = linear_backward(dpre, dweight, dbias, dy, act, W, overwrite), gelu_backward in place
//         on dpre, then dpre_bias as linear_backward computes a bias gradient.
//   Shapes: x (N, I), pre and act (N, F), W (F, I) and b (F) for the forward; dy (N, O),
//   act, pre, dpre (N, I), W (O, I), dpre_bias (I), dbias (O) for the backward (I is the GELU
//   width there). dpre_bias, dweight, dbias may be null (frozen). Dtypes as linear's.
//   On CUDA the tanh GELU runs inside cuBLASLt, from the fp32 accumulator (pre is still saved
//   rounded to bf16); the erf GELU, which cuBLASLt does not have, runs as the separate kernel.
//
// Precision: every linear op takes a LinearSpec, what its caller (the block schedule, per the
// model's precision policy) asks of it. kNative is the dtypes above. The fp8 precisions are a
// choice of GEMM kernel behind the same ops (the GEMMs take their operands' dtypes and scales
// through ops/gemm_args.h). kFp8PerTensor runs on CUDA in linear_forward, linear_residual_forward
// and linear_backward, in the caller's Fp8LinearBuffers (below):
//   forward:  x cast to E4M3 with its current amax (codes xq and the transpose xqt, one read of
//             x after its amax pass), y = sx sw (xq . wq^T) + bias [+ residual] (ops/cuda/
//             fp8_linear.h), wq and wqt cast from W once per optimizer step by
//             linear_fp8_cast_weight;
//   backward: dy cast to grad_dtype (dyq, dyqt), dx = sdy sw (dyq . wqt^T) (= or +=),
//             dweight += sdy sx (dyqt . xqt^T), dbias += sum_n dy (bf16 dy, as the native op).
//   Delayed scaling (Fp8LinearBuffers::delayed_scale set): every cast above uses the given
//             scale instead of its tensor's amax (one read of x, w, dy) and reports the amax
//             into Fp8LinearBuffers::step_amax.
// kFp8Blockwise runs on CUDA in the same ops (and linear_fp8_cast_weight), in the caller's
// Fp8BlockwiseBuffers (LinearSpec::fp8_block; ops/fp8_blockwise.h has the scheme, the buffers and
// fp8_blockwise_buffer_bytes(N, I, O) for a memory plan): E4M3 codes with an f32 scale per 1 x 128
// block of x and dy (their transposes re-quantized in 1 x 128 blocks along the tokens for the
// weight gradient) and per 128 x 128 block of W, through cuBLASLt's block-scaled GEMMs.
// Every other fp8 case stops with "fp8 linear: no kernel ...", naming the op, the precision, the
// linear's role and the backend: the CPU backend, the GELU ops, and a CUDA call without buffers.
#include <cstdint>
#include <string_view>

#include "core/tensor.h"
#include "ops/context.h"
#include "ops/fp8_blockwise.h"
#include "ops/gelu.h"

namespace lathe {

// The number format of a linear's GEMMs.
//   kNative        the backend's: bf16 operands with fp32 accumulation on CUDA, f32 on the CPU
//   kFp8PerTensor  e4m3 weights and activations, e5m2 gradients, one f32 scale per tensor
//   kFp8Blockwise  e4m3 weights, activations and gradients with an f32 scale per block
//                  (1 x 128 of activations and gradients, 128 x 128 of weights)
enum class LinearPrecision : uint8_t { kNative, kFp8PerTensor, kFp8Blockwise };

// "native", "fp8_per_tensor", "fp8_blockwise".
std::string_view linear_precision_name(LinearPrecision p);

// Device memory of one kFp8PerTensor linear on CUDA, owned by the caller; N is the token count of
// the micro-batch, (O, I) the weight's shape. Codes are one byte an element; every pointer
// 16-byte aligned.
struct Fp8LinearBuffers {
    void* wq = nullptr;               // (O, I) E4M3: the weight's codes (linear_fp8_cast_weight)
    void* wqt = nullptr;              // (I, O) E4M3: their transpose
    void* xq = nullptr;               // (N, I): the forward's scratch
    void* xqt = nullptr;              // (I, N): written by the forward, read by the backward
    void* dyq = nullptr;              // (N, O): the backward's scratch
    void* dyqt = nullptr;             // (O, N): the backward's scratch
    float* scalars = nullptr;         // 24 f32: amax and scale_inv of x at 0 and 4, w at 8 and 12,
                                      // dy at 16 and 20
    DType grad_dtype = DType::kE5M2;  // dy's codes: E5M2 or E4M3
    int64_t* gemm_count = nullptr;    // host counter: += 1 per FP8 GEMM enqueued (may be null)
    // Delayed scaling (fp8.recipe delayed, model/fp8_state.h): 3 f32 scales of x, w and dy, in
    // that order (Fp8Tensor's), that the casts use instead of each tensor's current amax; null:
    // current scaling. With them step_amax (3 f32, same order) is required: each cast reports
    // its tensor's amax into its slot of scalars, then max-accumulates it into step_amax (an
    // integer max of the f32 bits, as the casts' own amax), so the micro-batches of a step
    // leave the step's amax there for the caller to read once per optimizer step and zero.
    const float* delayed_scale = nullptr;
    float* step_amax = nullptr;
};

// What a caller asks of one linear: its precision, its role in the model ("qkv", "mlp_down":
// for messages; empty reads as "linear"), and for kFp8PerTensor on CUDA its buffers.
struct LinearSpec {
    LinearPrecision precision = LinearPrecision::kNative;
    std::string_view role;
    const Fp8LinearBuffers* fp8 = nullptr;
    const Fp8BlockwiseBuffers* fp8_block = nullptr;  // for kFp8Blockwise on CUDA
    // kFp8PerTensor with current scaling: a device f32 holding amax(x) of the forward's input,
    // computed by the kernel that wrote x (rmsnorm_forward's y_amax, swiglu_forward's out_amax),
    // so x's cast reads x once instead of twice (Fp8CastArgs::amax_ready; the cast takes the
    // amax from here, its slot in Fp8LinearBuffers::scalars stays unwritten). Null: the cast
    // computes it. Not read under delayed scaling (the cast's own pass reports the amax) nor by
    // the other precisions.
    const float* x_amax = nullptr;
    // The same for the backward's dy (swiglu_backward's dgate_up_amax for the MLP's up
    // projection): linear_backward's dy cast reads dy once.
    const float* dy_amax = nullptr;
    // kNative on CUDA: linear_forward, linear_residual_forward and linear_gelu_forward run the
    // skinny GEMM of ops/cuda/gemv.h instead of cuBLASLt when x has at most cuda::kGemvMaxRows
    // rows and the shape suits it (cuda::gemv_supports); otherwise cuBLASLt as without it. The
    // GELU then runs as its own kernel on the bf16 pre-activation (as the erf form always does).
    // The decode step's choice (infer/engine.h, EngineLimits::decode_gemv). Ignored by the CPU
    // and the other ops.
    bool skinny_gemv = false;
    // How linear_backward and linear_gelu_backward write dweight: kAccumulate adds (+=; the
    // micro-batches of a step sum there), kOverwrite writes dweight = dy^T x, the step's first
    // contribution, so that the caller need not clear it first (model/model.h,
    // Model::zero_grads_beside_forward). = is what += onto a zeroed dweight gives: the CPU
    // computes it so; CUDA runs the GEMM with beta 0 (dweight is not read, whatever it holds),
    // which cuBLASLt may give another algorithm than beta 1, so the bits may differ from += onto
    // zeros by the fp32 sum's order. dbias (and linear_gelu_backward's dpre_bias) accumulate
    // either way. The LM head (ops/lm_head_cross_entropy.h) reads it for its dweight too.
    GradMode dweight_mode = GradMode::kAccumulate;
};

// Stops (LATHE_CHECK) unless ctx's backend runs `spec` in this build, naming `op`, the precision,
// the role and the backend. The linear ops call it first; a caller whose linear runs inside
// another op (the LM head's GEMMs in lm_head_cross_entropy) calls it before that op.
void linear_expect_precision(std::string_view op, const LinearSpec& spec, const Context& ctx);

void linear_forward(TensorView y, ConstTensorView x, ConstTensorView weight, ConstTensorView bias,
                    const Context& ctx, const LinearSpec& spec = {});

// The weight's FP8 copies for a kFp8PerTensor linear: wq and wqt of spec.fp8 from weight (O, I)
// bf16, scaled by its current amax. Once per optimizer step (after the update), not per
// micro-batch. CUDA only; stops elsewhere, naming the role.
void linear_fp8_cast_weight(ConstTensorView weight, const Context& ctx, const LinearSpec& spec);

// A projection whose output joins the residual stream:  y = residual + (x W^T + b).
//   = linear_forward(y, x, W, b) then residual_forward(y, residual, y): so on the CPU, bit for bit
//   a linear into a temporary followed by a residual add. CUDA: one GEMM reading the
//   residual as cuBLASLt's C (one bf16 rounding instead of two; no temporary, no add kernel).
//   Shapes: residual and y as y of linear_forward; y must not be residual or x (checked).
//   The backward is linear_backward's, with the residual's gradient passing through unchanged.
void linear_residual_forward(TensorView y, ConstTensorView x, ConstTensorView weight,
                             ConstTensorView bias, ConstTensorView residual, const Context& ctx,
                             const LinearSpec& spec = {});

// For an op that writes a weight gradient per spec.dweight_mode (the linear ops, the LM head),
// after its checks: whether its GEMMs add into dweight (beta 1). kOverwrite on the CPU, or with
// no rows to sum, clears dweight here and answers true, so that = is += onto zeros there; on
// CUDA with rows it answers false (the GEMMs' beta 0). A null dweight answers true.
bool dweight_accumulates(TensorView dweight, const LinearSpec& spec, int64_t rows,
                         const Context& ctx);

void linear_backward(TensorView dx, TensorView dweight, TensorView dbias, ConstTensorView dy,
                     ConstTensorView x, ConstTensorView weight, GradMode dx_mode,
                     const Context& ctx, const LinearSpec& spec = {});

void linear_gelu_forward(TensorView act, TensorView pre, ConstTensorView x, ConstTensorView weight,
                         ConstTensorView bias, GeluKind kind, const Context& ctx,
                         const LinearSpec& spec = {});

void linear_gelu_backward(TensorView dpre, TensorView dpre_bias, TensorView dweight,
                          TensorView dbias, ConstTensorView dy, ConstTensorView act,
                          ConstTensorView pre, ConstTensorView weight, GeluKind kind,
                          const Context& ctx, const LinearSpec& spec = {});

}  // namespace lathe
