// Built with -ffp-contract=off (CMakeLists.txt): no multiply-add below may fuse except the
// explicit fma of the lerp, on every path, or the paths would round differently.
#include "optim/cpu_adamw.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/check.h"
#include "ops/grad_norm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define LATHE_X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#define LATHE_NEON 1
#endif

namespace lathe {

const char* cpu_adamw_path_name(CpuAdamWPath path) {
    switch (path) {
        case CpuAdamWPath::kAuto:
            return "auto";
        case CpuAdamWPath::kScalar:
            return "scalar";
        case CpuAdamWPath::kAvx2:
            return "avx2";
        case CpuAdamWPath::kAvx512:
            return "avx512";
        case CpuAdamWPath::kNeon:
            return "neon";
    }
    return "?";
}

bool cpu_adamw_path_available(CpuAdamWPath path) {
    switch (path) {
        case CpuAdamWPath::kAuto:
        case CpuAdamWPath::kScalar:
            return true;
#if LATHE_X86
        case CpuAdamWPath::kAvx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case CpuAdamWPath::kAvx512:
            // Its functions are compiled for AVX-512F with AVX2 and FMA (every AVX-512 CPU has
            // both; the check keeps the claim honest).
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
                   __builtin_cpu_supports("fma");
#endif
#if LATHE_NEON
        case CpuAdamWPath::kNeon:
            return true;  // Advanced SIMD is part of every AArch64 CPU
#endif
        default:
            return false;
    }
}

CpuAdamWPath cpu_adamw_best_path() {
    for (CpuAdamWPath p : {CpuAdamWPath::kAvx512, CpuAdamWPath::kAvx2, CpuAdamWPath::kNeon})
        if (cpu_adamw_path_available(p)) return p;
    return CpuAdamWPath::kScalar;
}

namespace {

// The fp32 scalars of one segment's update, formed as ops/cpu/adamw.cpp and the CUDA kernel
// form them.
struct Scalars {
    float coef = 1.0f;  // clip coefficient; applied only when scale
    bool scale = false;
    float decay = 1.0f;  // 1 - lr * wd; applied only when apply_decay
    bool apply_decay = false;
    float neg_step_size = 0.0f;  // -(lr / (1 - beta1^t))
    float bc2_sqrt = 1.0f;       // sqrt(1 - beta2^t)
    float w1 = 0.0f, w1m1 = 0.0f, b2 = 0.0f, w2 = 0.0f, eps = 0.0f;
    bool lerp_low = true;
};

// ---- scalar path: defines the result ----

template <bool kBf16>
inline float load_state(const void* s, int64_t i) {
    if constexpr (kBf16)
        return bf16_to_float(static_cast<const bf16*>(s)[i]);
    else
        return static_cast<const float*>(s)[i];
}

template <bool kBf16>
inline void store_state(void* s, int64_t i, float x) {
    if constexpr (kBf16)
        static_cast<bf16*>(s)[i] = float_to_bf16(x);
    else
        static_cast<float*>(s)[i] = x;
}

template <bool kBf16>
void range_scalar(const CpuAdamWBuffers& b, int64_t begin, int64_t end, const Scalars& k) {
    for (int64_t i = begin; i < end; ++i) {
        float g = b.grads[i];
        if (k.scale) g = g * k.coef;
        float p = b.params[i];
        if (k.apply_decay) p = p * k.decay;
        const float mo = load_state<kBf16>(b.m, i);
        const float vo = load_state<kBf16>(b.v, i);
        const float d = g - mo;
        const float mi = k.lerp_low ? std::fma(k.w1, d, mo) : std::fma(k.w1m1, d, g);
        const float vi = vo * k.b2 + (k.w2 * g) * g;
        const float denom = std::sqrt(vi) / k.bc2_sqrt + k.eps;
        p = p + (k.neg_step_size * mi) / denom;
        b.params[i] = p;
        store_state<kBf16>(b.m, i, mi);
        store_state<kBf16>(b.v, i, vi);
        if (b.params_bf16 != nullptr) b.params_bf16[i] = float_to_bf16(p);
    }
}

// ---- x86-64: AVX2+FMA (8 lanes) and AVX-512 (16 lanes) ----
#if LATHE_X86
// The bf16 copy is written, never read, by the update (a staging buffer the GPU copies from): the
// vector paths store it with non-temporal stores, which skip reading each cache line from memory
// before writing it (2 of about 24 bytes a parameter with bf16 moments), and need
// `bytes`-aligned addresses. The index from `begin` at which b.params_bf16 + i is so aligned
// (the elements before it go through the scalar path), at most `end`; `begin` without a copy.
int64_t bf16_copy_aligned_from(const CpuAdamWBuffers& b, int64_t begin, int64_t end,
                               uintptr_t bytes) {
    if (b.params_bf16 == nullptr) return begin;
    const uintptr_t at = reinterpret_cast<uintptr_t>(b.params_bf16 + begin);
    // bf16 addresses are even: (bytes - at % bytes) / 2 elements reach the next aligned one.
    const int64_t peel = int64_t(((bytes - at % bytes) % bytes) / sizeof(bf16));
    return std::min(end, begin + peel);
}

#define LATHE_AVX2 __attribute__((target("avx2,fma")))
#define LATHE_AVX512 __attribute__((target("avx512f,avx2,fma")))

// float_to_bf16 on 8 lanes: (u + 0x7FFF + lsb) >> 16, NaN -> (u | quiet bit) >> 16.
LATHE_AVX2 inline __m128i bf16_from_avx2(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i hi = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
    // packus works per 128-bit lane: [h0..h3 h0..h3 | h4..h7 h4..h7]; keep quadwords 0 and 2.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(hi, hi), 0x08));
}

template <bool kBf16>
LATHE_AVX2 inline __m256 load_state_avx2(const void* s, int64_t i) {
    if constexpr (kBf16) {
        const __m128i h =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const bf16*>(s) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
        return _mm256_loadu_ps(static_cast<const float*>(s) + i);
    }
}

template <bool kBf16>
LATHE_AVX2 inline void store_state_avx2(void* s, int64_t i, __m256 x) {
    if constexpr (kBf16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<bf16*>(s) + i), bf16_from_avx2(x));
    else
        _mm256_storeu_ps(static_cast<float*>(s) + i, x);
}

template <bool kBf16>
LATHE_AVX2 void range_avx2(const CpuAdamWBuffers& b, int64_t begin, int64_t end, const Scalars& k) {
    const __m256 coef = _mm256_set1_ps(k.coef), decay = _mm256_set1_ps(k.decay);
    const __m256 nss = _mm256_set1_ps(k.neg_step_size), bc2 = _mm256_set1_ps(k.bc2_sqrt);
    const __m256 w1 = _mm256_set1_ps(k.w1), w1m1 = _mm256_set1_ps(k.w1m1);
    const __m256 b2 = _mm256_set1_ps(k.b2), w2 = _mm256_set1_ps(k.w2), eps = _mm256_set1_ps(k.eps);
    int64_t i = bf16_copy_aligned_from(b, begin, end, 16);
    range_scalar<kBf16>(b, begin, i, k);
    for (; i + 8 <= end; i += 8) {
        __m256 g = _mm256_loadu_ps(b.grads + i);
        if (k.scale) g = _mm256_mul_ps(g, coef);
        __m256 p = _mm256_loadu_ps(b.params + i);
        if (k.apply_decay) p = _mm256_mul_ps(p, decay);
        const __m256 mo = load_state_avx2<kBf16>(b.m, i);
        const __m256 vo = load_state_avx2<kBf16>(b.v, i);
        const __m256 d = _mm256_sub_ps(g, mo);
        const __m256 mi = k.lerp_low ? _mm256_fmadd_ps(w1, d, mo) : _mm256_fmadd_ps(w1m1, d, g);
        const __m256 vi =
            _mm256_add_ps(_mm256_mul_ps(vo, b2), _mm256_mul_ps(_mm256_mul_ps(w2, g), g));
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(nss, mi), denom));
        _mm256_storeu_ps(b.params + i, p);
        store_state_avx2<kBf16>(b.m, i, mi);
        store_state_avx2<kBf16>(b.v, i, vi);
        if (b.params_bf16 != nullptr)
            _mm_stream_si128(reinterpret_cast<__m128i*>(b.params_bf16 + i), bf16_from_avx2(p));
    }
    // The non-temporal stores ordered before whatever this thread does next (the pool's
    // hand-back, after which the copy is read).
    if (b.params_bf16 != nullptr) _mm_sfence();
    range_scalar<kBf16>(b, i, end, k);
}

// GCC 12 reports the deliberately undefined upper halves inside avx512fintrin.h's own
// _mm512_set1/cvt helpers as maybe uninitialized: a false positive of the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
LATHE_AVX512 inline __m256i bf16_from_avx512(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
    const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(
        _mm512_srli_epi32(_mm512_mask_blend_epi32(nan, rounded, quiet), 16));
}

template <bool kBf16>
LATHE_AVX512 inline __m512 load_state_avx512(const void* s, int64_t i) {
    if constexpr (kBf16) {
        const __m256i h =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const bf16*>(s) + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
        return _mm512_loadu_ps(static_cast<const float*>(s) + i);
    }
}

template <bool kBf16>
LATHE_AVX512 inline void store_state_avx512(void* s, int64_t i, __m512 x) {
    if constexpr (kBf16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<bf16*>(s) + i),
                            bf16_from_avx512(x));
    else
        _mm512_storeu_ps(static_cast<float*>(s) + i, x);
}

template <bool kBf16>
LATHE_AVX512 void range_avx512(const CpuAdamWBuffers& b, int64_t begin, int64_t end,
                               const Scalars& k) {
    const __m512 coef = _mm512_set1_ps(k.coef), decay = _mm512_set1_ps(k.decay);
    const __m512 nss = _mm512_set1_ps(k.neg_step_size), bc2 = _mm512_set1_ps(k.bc2_sqrt);
    const __m512 w1 = _mm512_set1_ps(k.w1), w1m1 = _mm512_set1_ps(k.w1m1);
    const __m512 b2 = _mm512_set1_ps(k.b2), w2 = _mm512_set1_ps(k.w2), eps = _mm512_set1_ps(k.eps);
    int64_t i = bf16_copy_aligned_from(b, begin, end, 32);
    range_scalar<kBf16>(b, begin, i, k);
    for (; i + 16 <= end; i += 16) {
        __m512 g = _mm512_loadu_ps(b.grads + i);
        if (k.scale) g = _mm512_mul_ps(g, coef);
        __m512 p = _mm512_loadu_ps(b.params + i);
        if (k.apply_decay) p = _mm512_mul_ps(p, decay);
        const __m512 mo = load_state_avx512<kBf16>(b.m, i);
        const __m512 vo = load_state_avx512<kBf16>(b.v, i);
        const __m512 d = _mm512_sub_ps(g, mo);
        const __m512 mi = k.lerp_low ? _mm512_fmadd_ps(w1, d, mo) : _mm512_fmadd_ps(w1m1, d, g);
        const __m512 vi =
            _mm512_add_ps(_mm512_mul_ps(vo, b2), _mm512_mul_ps(_mm512_mul_ps(w2, g), g));
        const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
        p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(nss, mi), denom));
        _mm512_storeu_ps(b.params + i, p);
        store_state_avx512<kBf16>(b.m, i, mi);
        store_state_avx512<kBf16>(b.v, i, vi);
        if (b.params_bf16 != nullptr)
            _mm256_stream_si256(reinterpret_cast<__m256i*>(b.params_bf16 + i), bf16_from_avx512(p));
    }
    if (b.params_bf16 != nullptr) _mm_sfence();
    range_scalar<kBf16>(b, i, end, k);
}
#pragma GCC diagnostic pop
#endif  // LATHE_X86

// ---- aarch64: NEON (4 lanes) ----
#if LATHE_NEON
inline uint16x4_t bf16_from_neon(float32x4_t x) {
    const uint32x4_t u = vreinterpretq_u32_f32(x);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t rounded = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7FFF)), lsb);
    const uint32x4_t quiet = vorrq_u32(u, vdupq_n_u32(0x00400000));
    const uint32x4_t not_nan = vceqq_f32(x, x);
    return vshrn_n_u32(vbslq_u32(not_nan, rounded, quiet), 16);
}

template <bool kBf16>
inline float32x4_t load_state_neon(const void* s, int64_t i) {
    if constexpr (kBf16) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(static_cast<const bf16*>(s) + i);
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h), 16));
    } else {
        return vld1q_f32(static_cast<const float*>(s) + i);
    }
}

template <bool kBf16>
inline void store_state_neon(void* s, int64_t i, float32x4_t x) {
    if constexpr (kBf16)
        vst1_u16(reinterpret_cast<uint16_t*>(static_cast<bf16*>(s) + i), bf16_from_neon(x));
    else
        vst1q_f32(static_cast<float*>(s) + i, x);
}

template <bool kBf16>
void range_neon(const CpuAdamWBuffers& b, int64_t begin, int64_t end, const Scalars& k) {
    const float32x4_t coef = vdupq_n_f32(k.coef), decay = vdupq_n_f32(k.decay);
    const float32x4_t nss = vdupq_n_f32(k.neg_step_size), bc2 = vdupq_n_f32(k.bc2_sqrt);
    const float32x4_t w1 = vdupq_n_f32(k.w1), w1m1 = vdupq_n_f32(k.w1m1);
    const float32x4_t b2 = vdupq_n_f32(k.b2), w2 = vdupq_n_f32(k.w2), eps = vdupq_n_f32(k.eps);
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
        float32x4_t g = vld1q_f32(b.grads + i);
        if (k.scale) g = vmulq_f32(g, coef);
        float32x4_t p = vld1q_f32(b.params + i);
        if (k.apply_decay) p = vmulq_f32(p, decay);
        const float32x4_t mo = load_state_neon<kBf16>(b.m, i);
        const float32x4_t vo = load_state_neon<kBf16>(b.v, i);
        const float32x4_t d = vsubq_f32(g, mo);
        // vfmaq_f32(a, b, c) = a + b * c with one rounding.
        const float32x4_t mi = k.lerp_low ? vfmaq_f32(mo, w1, d) : vfmaq_f32(g, w1m1, d);
        const float32x4_t vi = vaddq_f32(vmulq_f32(vo, b2), vmulq_f32(vmulq_f32(w2, g), g));
        const float32x4_t denom = vaddq_f32(vdivq_f32(vsqrtq_f32(vi), bc2), eps);
        p = vaddq_f32(p, vdivq_f32(vmulq_f32(nss, mi), denom));
        vst1q_f32(b.params + i, p);
        store_state_neon<kBf16>(b.m, i, mi);
        store_state_neon<kBf16>(b.v, i, vi);
        if (b.params_bf16 != nullptr)
            vst1_u16(reinterpret_cast<uint16_t*>(b.params_bf16 + i), bf16_from_neon(p));
    }
    range_scalar<kBf16>(b, i, end, k);
}
#endif  // LATHE_NEON

using RangeFn = void (*)(const CpuAdamWBuffers&, int64_t, int64_t, const Scalars&);

RangeFn range_fn(CpuAdamWPath path, AdamWStateDType dtype) {
    const bool h = dtype == AdamWStateDType::kBF16;
    switch (path) {
#if LATHE_X86
        case CpuAdamWPath::kAvx2:
            return h ? range_avx2<true> : range_avx2<false>;
        case CpuAdamWPath::kAvx512:
            return h ? range_avx512<true> : range_avx512<false>;
#endif
#if LATHE_NEON
        case CpuAdamWPath::kNeon:
            return h ? range_neon<true> : range_neon<false>;
#endif
        default:
            return h ? range_scalar<true> : range_scalar<false>;
    }
}

// threads() - 1 workers that wait for a job, run job(k) for their k in [1, threads), and report
// back; run() gives part 0 to the calling thread.
class WorkerPool {
public:
    explicit WorkerPool(int threads) : size_(threads) {
        for (int k = 1; k < threads; ++k) workers_.emplace_back([this, k] { worker(k); });
    }
    ~WorkerPool() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        start_cv_.notify_all();
        for (std::thread& t : workers_) t.join();
    }
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;

    int size() const { return size_; }

    void run(const std::function<void(int)>& job) {
        if (size_ > 1) {
            std::lock_guard<std::mutex> lock(mu_);
            job_ = &job;
            pending_ = size_ - 1;
            ++generation_;
        }
        start_cv_.notify_all();
        job(0);
        if (size_ > 1) {
            std::unique_lock<std::mutex> lock(mu_);
            done_cv_.wait(lock, [this] { return pending_ == 0; });
            job_ = nullptr;
        }
    }

private:
    void worker(int k) {
        uint64_t seen = 0;
        while (true) {
            const std::function<void(int)>* job = nullptr;
            {
                std::unique_lock<std::mutex> lock(mu_);
                start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
                job = job_;
            }
            (*job)(k);
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (--pending_ == 0) done_cv_.notify_one();
            }
        }
    }

    const int size_;
    std::mutex mu_;
    std::condition_variable start_cv_, done_cv_;
    const std::function<void(int)>* job_ = nullptr;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::vector<std::thread> workers_;
};

void check_call(const CpuAdamWBuffers& b, std::span<const AdamWSegment> segments) {
    constexpr const char* kWhat = "CpuAdamW";
    LATHE_CHECK(b.numel >= 0 && b.params != nullptr && b.m != nullptr && b.v != nullptr &&
                    b.grads != nullptr,
                "{}: buffers missing (numel {})", kWhat, b.numel);
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const AdamWSegment& s : segments) {
        LATHE_CHECK(s.offset >= 0 && s.count >= 0 && s.offset + s.count <= b.numel,
                    "{}: segment [{}, {}) outside the {} parameters", kWhat, s.offset,
                    s.offset + s.count, b.numel);
        ranges.push_back({s.offset, s.offset + s.count});
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        LATHE_CHECK(ranges[i].first >= ranges[i - 1].second,
                    "{}: segments [{}, {}) and [{}, {}) overlap", kWhat, ranges[i - 1].first,
                    ranges[i - 1].second, ranges[i].first, ranges[i].second);
}

// Runs fn(segment index, begin, end) over thread k's part of the segments' concatenated
// elements: [bound(k), bound(k + 1)) with bound(j) = floor(total * j / parts) rounded down to a
// multiple of kCpuAdamWPageElems, bound(parts) = total.
template <class Fn>
void for_part(std::span<const AdamWSegment> segments, int64_t total, int k, int parts,
              const Fn& fn) {
    const auto bound = [&](int j) {
        if (j >= parts) return total;
        const int64_t b = total * j / parts;  // total * threads fits in int64
        return b - b % kCpuAdamWPageElems;
    };
    const int64_t lo = bound(k), hi = bound(k + 1);
    if (lo >= hi) return;
    int64_t base = 0;  // first concatenated index of segment s
    for (size_t s = 0; s < segments.size() && base < hi; ++s) {
        const int64_t n = segments[s].count;
        const int64_t a = std::max(lo, base), e = std::min(hi, base + n);
        if (a < e) fn(s, segments[s].offset + (a - base), segments[s].offset + (e - base));
        base += n;
    }
}

int64_t total_count(std::span<const AdamWSegment> segments) {
    int64_t total = 0;
    for (const AdamWSegment& s : segments) total += s.count;
    return total;
}

}  // namespace

struct CpuAdamW::Impl {
    explicit Impl(int threads, CpuAdamWPath p) : pool(threads), path(p) {}
    WorkerPool pool;
    CpuAdamWPath path;
};

Result<CpuAdamW> CpuAdamW::create(int threads, CpuAdamWPath path) {
    if (threads < 0)
        return invalid_argument_error("CpuAdamW: threads must be >= 0 (0 = all cores), got {}",
                                      threads);
    if (!cpu_adamw_path_available(path))
        return invalid_argument_error("CpuAdamW: the {} path is not available on this CPU/build",
                                      cpu_adamw_path_name(path));
    if (threads == 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    if (path == CpuAdamWPath::kAuto) path = cpu_adamw_best_path();
    return CpuAdamW(std::make_unique<Impl>(threads, path));
}

CpuAdamW::CpuAdamW(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuAdamW::CpuAdamW(CpuAdamW&&) noexcept = default;
CpuAdamW& CpuAdamW::operator=(CpuAdamW&&) noexcept = default;
CpuAdamW::~CpuAdamW() = default;

int CpuAdamW::threads() const {
    return impl_->pool.size();
}

CpuAdamWPath CpuAdamW::path() const {
    return impl_->path;
}

void CpuAdamW::zero_state(const CpuAdamWBuffers& buf, std::span<const AdamWSegment> segments) {
    check_call(buf, segments);
    const int64_t total = total_count(segments);
    const size_t es = adamw_state_dtype_bytes(buf.state_dtype);
    const int parts = impl_->pool.size();
    impl_->pool.run([&](int k) {
        for_part(segments, total, k, parts, [&](size_t, int64_t a, int64_t e) {
            std::memset(static_cast<char*>(buf.m) + a * es, 0, size_t(e - a) * es);
            std::memset(static_cast<char*>(buf.v) + a * es, 0, size_t(e - a) * es);
        });
    });
}

void CpuAdamW::step(const CpuAdamWBuffers& buf, std::span<const AdamWSegment> segments,
                    const AdamWHyper& hyper, int64_t step, const float* clip_norm, float max_norm) {
    check_call(buf, segments);
    LATHE_CHECK(step >= 1, "CpuAdamW: step {} (the first update is step 1)", step);
    // The scalars exactly as ops/cpu/adamw.cpp and ops/cuda/adamw.cu form them.
    const double bias_correction1 = 1.0 - std::pow(hyper.beta1, double(step));
    const double bias_correction2 = 1.0 - std::pow(hyper.beta2, double(step));
    Scalars common;
    if (clip_norm != nullptr && std::isfinite(*clip_norm)) {
        common.coef = grad_clip_coefficient(*clip_norm, max_norm);
        common.scale = common.coef < 1.0f;
    }
    common.bc2_sqrt = float(std::sqrt(bias_correction2));
    common.w1 = float(1.0 - hyper.beta1);
    common.w1m1 = common.w1 - 1.0f;
    common.b2 = float(hyper.beta2);
    common.w2 = float(1.0 - hyper.beta2);
    common.eps = float(hyper.eps);
    common.lerp_low = std::fabs(1.0 - hyper.beta1) < 0.5;
    std::vector<Scalars> per_segment(segments.size(), common);
    for (size_t s = 0; s < segments.size(); ++s) {
        per_segment[s].decay = float(1.0 - segments[s].lr * segments[s].weight_decay);
        per_segment[s].apply_decay = segments[s].weight_decay != 0.0;
        per_segment[s].neg_step_size = float(-(segments[s].lr / bias_correction1));
    }
    const RangeFn fn = range_fn(impl_->path, buf.state_dtype);
    const int64_t total = total_count(segments);
    const int parts = impl_->pool.size();
    impl_->pool.run([&](int k) {
        for_part(segments, total, k, parts,
                 [&](size_t s, int64_t a, int64_t e) { fn(buf, a, e, per_segment[s]); });
    });
}

}  // namespace lathe
