// What cuBLASLt's other algorithms give at the training step's GEMM shapes, against the one its
// heuristic ranks first (the one ops/cuda/gemm.cu runs):
//
//   gemm_algo_search [--shapes gpt2,llama-1b,llama3-8b] [--algos 24] [--reps 10]
//
// For each shape of a layer's forward (D = X W^T, bf16), input gradient (dX = dY W, bf16) and
// weight gradient (dW += dY^T X, f32 accumulated, beta 1), and the LM head's chunk, it asks the
// heuristic for up to --algos candidates with the workspace the engine gives (CudaState), times
// each (median of --reps launches after 3 warm-up ones, CUDA events), and prints each candidate's
// TFLOP/s and whether its D equals the first candidate's bit for bit on the same random operands
// (all of D up to 256 MiB, else its first and last 128 MiB). Operands are row-major as in
// ops/gemm.h and mapped to cuBLASLt's column-major the way gemm.cu maps them. One line per shape
// ends with "best/first": the gain the fastest same-bits candidate would give.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace {

#define CHECK_CUDA(x)                                                                       \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            std::fprintf(stderr, "gemm_algo_search: %s: %s\n", #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                   \
        }                                                                                   \
    } while (0)
#define CHECK_LT(x)                                                                            \
    do {                                                                                       \
        cublasStatus_t s_ = (x);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            std::fprintf(stderr, "gemm_algo_search: %s: %s\n", #x, cublasLtGetStatusName(s_)); \
            std::exit(1);                                                                      \
        }                                                                                      \
    } while (0)

constexpr size_t kWorkspace = size_t(32) << 20;  // CudaState::kWorkspaceBytes

// Row-major D (M, N) = op(A) op(B) + beta D, A (M, K) or stored (K, M) when trans_a, B (K, N) or
// stored (N, K) when trans_b.
struct Shape {
    std::string name;
    int64_t M, N, K;
    bool trans_a, trans_b;
    bool f32_accumulate;  // D f32 with beta 1 (a weight gradient); else bf16, beta 0
};

// Fills n bf16 values with a repeating 2^20-value block of uniform values in [-scale/2, scale/2).
void fill(void* p, size_t n, uint32_t seed, float scale) {
    std::vector<uint16_t> h(std::min<size_t>(n, size_t(1) << 20));
    uint32_t x = seed;
    for (auto& v : h) {
        x = x * 1664525u + 1013904223u;
        const float f = (float(x >> 8) / 16777216.0f - 0.5f) * scale;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        v = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // round to nearest even
    }
    for (size_t at = 0; at < n; at += h.size())
        CHECK_CUDA(cudaMemcpy(static_cast<uint16_t*>(p) + at, h.data(),
                              std::min(h.size(), n - at) * 2, cudaMemcpyHostToDevice));
}

// Whether two device buffers hold the same bytes: all of them up to 256 MiB, else the first and
// the last 128 MiB (a split-K or another reduction order shows everywhere).
bool same_bytes(const void* a, const void* b, size_t bytes) {
    const size_t piece = size_t(128) << 20;
    std::vector<std::pair<size_t, size_t>> ranges;
    if (bytes <= 2 * piece)
        ranges.push_back({0, bytes});
    else
        ranges = {{0, piece}, {bytes - piece, piece}};
    std::vector<unsigned char> ha, hb;
    for (const auto& r : ranges) {
        ha.resize(r.second);
        hb.resize(r.second);
        CHECK_CUDA(cudaMemcpy(ha.data(), static_cast<const char*>(a) + r.first, r.second,
                              cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaMemcpy(hb.data(), static_cast<const char*>(b) + r.first, r.second,
                              cudaMemcpyDeviceToHost));
        if (std::memcmp(ha.data(), hb.data(), r.second) != 0) return false;
    }
    return true;
}

void run_shape(cublasLtHandle_t lt, const Shape& s, int max_algos, int reps, void* workspace) {
    const cudaDataType_t d_type = s.f32_accumulate ? CUDA_R_32F : CUDA_R_16BF;
    const size_t d_elem = s.f32_accumulate ? 4 : 2;
    void *A = nullptr, *B = nullptr;
    void *D = nullptr, *D0 = nullptr, *Dref = nullptr, *Dtry = nullptr;
    const size_t a_n = size_t(s.M * s.K), b_n = size_t(s.K * s.N), d_n = size_t(s.M * s.N);
    CHECK_CUDA(cudaMalloc(&A, a_n * 2));
    CHECK_CUDA(cudaMalloc(&B, b_n * 2));
    CHECK_CUDA(cudaMalloc(&D, d_n * d_elem));
    CHECK_CUDA(cudaMalloc(&D0, d_n * d_elem));
    CHECK_CUDA(cudaMalloc(&Dref, d_n * d_elem));
    CHECK_CUDA(cudaMalloc(&Dtry, d_n * d_elem));
    fill(A, a_n, 17u, 2.0f);
    fill(B, b_n, 29u, 0.05f);
    CHECK_CUDA(cudaMemset(D0, 0, d_n * d_elem));
    if (s.f32_accumulate) {  // a gradient already holding something
        std::vector<float> h(std::min<size_t>(d_n, 1 << 20));
        for (size_t i = 0; i < h.size(); ++i) h[i] = float(int(i % 97) - 48) * 1e-3f;
        for (size_t at = 0; at < d_n; at += h.size())
            CHECK_CUDA(cudaMemcpy(static_cast<float*>(D0) + at, h.data(),
                                  std::min(h.size(), d_n - at) * 4, cudaMemcpyHostToDevice));
    }
    const int64_t lda = s.trans_a ? s.M : s.K, ldb = s.trans_b ? s.K : s.N, ldd = s.N;
    cublasLtMatrixLayout_t first, second, out;
    if (s.trans_b)
        CHECK_LT(cublasLtMatrixLayoutCreate(&first, CUDA_R_16BF, s.K, s.N, ldb));
    else
        CHECK_LT(cublasLtMatrixLayoutCreate(&first, CUDA_R_16BF, s.N, s.K, ldb));
    if (s.trans_a)
        CHECK_LT(cublasLtMatrixLayoutCreate(&second, CUDA_R_16BF, s.M, s.K, lda));
    else
        CHECK_LT(cublasLtMatrixLayoutCreate(&second, CUDA_R_16BF, s.K, s.M, lda));
    CHECK_LT(cublasLtMatrixLayoutCreate(&out, d_type, s.N, s.M, ldd));
    cublasLtMatmulDesc_t desc;
    CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const int32_t ta = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  tb = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspace;
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws)));
    std::vector<cublasLtMatmulHeuristicResult_t> results;
    results.resize(size_t(max_algos));
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, first, second, out, out, pref, max_algos,
                                            results.data(), &found));
    const float alpha = 1.0f, beta = s.f32_accumulate ? 1.0f : 0.0f;
    const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    double first_ms = 0, best_same_ms = 1e30;
    int best_same = -1;
    for (int i = 0; i < found; ++i) {
        if (results[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
        const cublasLtMatmulAlgo_t& algo = results[size_t(i)].algo;
        // Bits: one launch from D0.
        CHECK_CUDA(cudaMemcpy(Dtry, D0, d_n * d_elem, cudaMemcpyDeviceToDevice));
        cublasStatus_t st = cublasLtMatmul(lt, desc, &alpha, B, first, A, second, &beta, Dtry, out,
                                           Dtry, out, &algo, workspace, kWorkspace, nullptr);
        if (st != CUBLAS_STATUS_SUCCESS) {
            std::printf("  %-10s algo %2d: %s\n", s.name.c_str(), i, cublasLtGetStatusName(st));
            continue;
        }
        CHECK_CUDA(cudaDeviceSynchronize());
        if (i == 0) CHECK_CUDA(cudaMemcpy(Dref, Dtry, d_n * d_elem, cudaMemcpyDeviceToDevice));
        const bool same = same_bytes(Dref, Dtry, d_n * d_elem);
        std::vector<float> times;
        for (int r = 0; r < reps + 3; ++r) {
            CHECK_CUDA(cudaEventRecord(e0));
            CHECK_LT(cublasLtMatmul(lt, desc, &alpha, B, first, A, second, &beta, D, out, D, out,
                                    &algo, workspace, kWorkspace, nullptr));
            CHECK_CUDA(cudaEventRecord(e1));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 3) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        const double ms = times[times.size() / 2];
        if (i == 0) first_ms = ms;
        if (same && ms < best_same_ms) {
            best_same_ms = ms;
            best_same = i;
        }
        std::printf("  %-10s algo %2d: %8.4f ms %6.1f TFLOP/s %s\n", s.name.c_str(), i, ms,
                    flops / ms / 1e9, same ? "same-bits" : "OTHER-bits");
        std::fflush(stdout);
    }
    std::printf(
        "%-10s M %lld N %lld K %lld: first %.4f ms (%.1f TFLOP/s), best same-bits algo %d "
        "%.4f ms (%.1f TFLOP/s), best/first %.3f\n",
        s.name.c_str(), (long long)s.M, (long long)s.N, (long long)s.K, first_ms,
        flops / first_ms / 1e9, best_same, best_same_ms, flops / best_same_ms / 1e9,
        first_ms / best_same_ms);
    std::fflush(stdout);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatrixLayoutDestroy(first);
    cublasLtMatrixLayoutDestroy(second);
    cublasLtMatrixLayoutDestroy(out);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
    cudaFree(D0);
    cudaFree(Dref);
    cudaFree(Dtry);
}

// The linears of one layer at M tokens (forward, dX, dW) and the LM head's chunk of `rows`.
struct Linear {
    const char* name;
    int64_t N, K;  // the weight is (N, K): N outputs, K inputs
};

void add_layer(std::vector<Shape>& v, const std::string& tag, int64_t M,
               std::initializer_list<Linear> linears) {
    for (const Linear& l : linears) {
        const std::string base = tag + "." + l.name;
        v.push_back(Shape{base + ".fwd", M, l.N, l.K, false, true, false});
        v.push_back(Shape{base + ".dx", M, l.K, l.N, false, false, false});
        v.push_back(Shape{base + ".dw", l.N, l.K, M, true, false, true});
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::string shapes = "gpt2,llama-1b,llama3-8b";
    int max_algos = 24, reps = 10;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--shapes") == 0 && i + 1 < argc)
            shapes = argv[++i];
        else if (std::strcmp(argv[i], "--algos") == 0 && i + 1 < argc)
            max_algos = std::atoi(argv[++i]);
        else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr,
                         "usage: gemm_algo_search [--shapes gpt2,llama-1b,llama3-8b] "
                         "[--algos 24] [--reps 10]\n");
            return 2;
        }
    }
    std::vector<Shape> v;
    if (shapes.find("gpt2") != std::string::npos) {
        add_layer(v, "gpt2", 32768,
                  {{"qkv", 2304, 768}, {"proj", 768, 768}, {"fc", 3072, 768}, {"fc2", 768, 3072}});
        add_layer(v, "gpt2", 8192, {{"head", 50304, 768}});
    }
    if (shapes.find("llama-1b") != std::string::npos) {
        add_layer(
            v, "1b", 16384,
            {{"q", 2048, 2048}, {"kv", 512, 2048}, {"gateup", 16384, 2048}, {"down", 2048, 8192}});
        add_layer(v, "1b", 2048, {{"head", 128256, 2048}});
    }
    if (shapes.find("llama3-8b") != std::string::npos) {
        add_layer(v, "8b", 8192,
                  {{"q", 4096, 4096},
                   {"kv", 1024, 4096},
                   {"gateup", 28672, 4096},
                   {"down", 4096, 14336}});
        add_layer(v, "8b", 1056, {{"head", 128256, 4096}});
    }
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("gemm_algo_search on %s, cuBLASLt %zu, workspace %zu MiB, up to %d algorithms\n",
                prop.name, cublasLtGetVersion(), kWorkspace >> 20, max_algos);
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    void* workspace = nullptr;
    CHECK_CUDA(cudaMalloc(&workspace, kWorkspace));
    for (const Shape& s : v) run_shape(lt, s, max_algos, reps, workspace);
    cudaFree(workspace);
    cublasLtDestroy(lt);
    return 0;
}
