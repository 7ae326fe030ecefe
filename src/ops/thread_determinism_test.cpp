// The CPU ops promise results independent of the OpenMP thread count (each output is computed
// by one thread, reductions in a fixed order). Shapes here are big enough to take the parallel
// paths (ops/cpu/parallel.h); one thread and two threads must agree bit for bit.
#include <cstring>

#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/embedding.h"
#include "ops/grad_norm.h"
#include "ops/layernorm.h"
#include "ops/linear.h"
#include "ops/lm_head_cross_entropy.h"
#include "ops/op_test.h"
#include "ops/rmsnorm.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace lathe::optest {
namespace {

bool same_bits(const HostTensor& a, const HostTensor& b) {
    return a.numel() == b.numel() &&
           std::memcmp(a.view().data(), b.view().data(), a.view().bytes()) == 0;
}

// Runs `op` (which fills the returned tensors) with 1 and then 2 threads; compares the results.
template <typename Op>
void expect_thread_count_independent(const char* name, Op op) {
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    std::vector<HostTensor> one = op();
    omp_set_num_threads(2);
    std::vector<HostTensor> two = op();
    omp_set_num_threads(saved);
    ASSERT_EQ(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i)
        EXPECT_TRUE(same_bits(one[i], two[i])) << name << " #" << i;
#else
    GTEST_SKIP() << "built without OpenMP: " << name << " runs serially";
#endif
}

TEST(ThreadDeterminism, ParallelPathsGiveIdenticalBits) {
    const Context ctx = cpu_context();
    Rng rng(111);
    const int64_t N = 64, C = 512;
    HostTensor x = random_tensor(rng, Shape{N, C}), w = random_tensor(rng, Shape{C});
    HostTensor bias = random_tensor(rng, Shape{C}), dy = random_tensor(rng, Shape{N, C});
    expect_thread_count_independent("rmsnorm", [&] {
        std::vector<HostTensor> r;
        r.push_back(f32(Shape{N, C}));
        r.push_back(f32(Shape{N}));
        r.push_back(f32(Shape{N, C}));
        r.push_back(f32(Shape{C}));
        rmsnorm_forward(r[0].view(), r[1].view(), x.view(), w.view(), 1e-5f, ctx);
        rmsnorm_backward(r[2].view(), r[3].view(), dy.view(), x.view(), w.view(), r[1].view(),
                         GradMode::kOverwrite, ctx);
        return r;
    });
    expect_thread_count_independent("layernorm", [&] {
        std::vector<HostTensor> r;
        for (Shape s : {Shape{N, C}, Shape{N}, Shape{N}, Shape{N, C}, Shape{C}, Shape{C}})
            r.push_back(f32(s));
        layernorm_forward(r[0].view(), r[1].view(), r[2].view(), x.view(), w.view(), bias.view(),
                          1e-5f, ctx);
        layernorm_backward(r[3].view(), r[4].view(), r[5].view(), dy.view(), x.view(), w.view(),
                           r[1].view(), r[2].view(), GradMode::kOverwrite, ctx);
        return r;
    });

    // linear: BLAS calls on row blocks of C, one per thread.
    HostTensor wl = random_tensor(rng, Shape{384, C});
    HostTensor dyl = random_tensor(rng, Shape{N, 384});
    expect_thread_count_independent("linear", [&] {
        std::vector<HostTensor> r;
        for (Shape s : {Shape{N, 384}, Shape{N, C}, Shape{384, C}}) r.push_back(f32(s));
        linear_forward(r[0].view(), x.view(), wl.view(), {}, ctx);
        linear_backward(r[1].view(), r[2].view(), {}, dyl.view(), x.view(), wl.view(),
                        GradMode::kOverwrite, ctx);
        return r;
    });

    const int64_t B = 2, T = 32, H = 4, Hkv = 2, D = 16;
    HostTensor q = random_tensor(rng, Shape{B, T, H, D}),
               k = random_tensor(rng, Shape{B, T, Hkv, D});
    HostTensor v = random_tensor(rng, Shape{B, T, Hkv, D}),
               dout = random_tensor(rng, Shape{B, T, H, D});
    expect_thread_count_independent("attention", [&] {
        std::vector<HostTensor> r;
        for (Shape s : {q.shape(), Shape{B, H, T}, q.shape(), k.shape(), v.shape()})
            r.push_back(f32(s));
        attention_forward(r[0].view(), r[1].view(), q.view(), k.view(), v.view(), {}, 8, 0.25f,
                          ctx);
        attention_backward(r[2].view(), r[3].view(), r[4].view(), dout.view(), q.view(), k.view(),
                           v.view(), r[0].view(), r[1].view(), {}, 8, 0.25f, ctx);
        return r;
    });

    const int64_t V = 1024, Nt = 48, Ce = 64;
    HostTensor tokens(DType::kI32, Shape{1, Nt}), targets(DType::kI32, Shape{Nt});
    for (int64_t i = 0; i < Nt; ++i) {
        tokens.as<int32_t>()[i] = int32_t(rng.integer(0, 15));  // many repeats: shared rows
        targets.as<int32_t>()[i] = i % 5 == 0 ? kIgnoreIndex : int32_t(rng.integer(0, V - 1));
    }
    HostTensor emb_dout = random_tensor(rng, Shape{1, Nt, 1024});
    expect_thread_count_independent("embedding_backward", [&] {
        std::vector<HostTensor> r;
        r.push_back(f32(Shape{16, 1024}));
        embedding_backward(r[0].view(), {}, emb_dout.view(), tokens.view(), {}, ctx);
        return r;
    });
    HostTensor xh = random_tensor(rng, Shape{Nt, Ce}), wh = random_tensor(rng, Shape{V, Ce});
    expect_thread_count_independent("lm_head_cross_entropy", [&] {
        std::vector<HostTensor> r;
        for (Shape s : {Shape{1}, Shape{Nt}, Shape{Nt, Ce}, Shape{V, Ce}, Shape{16, V}})
            r.push_back(f32(s));
        lm_head_cross_entropy_forward_backward(r[0].view(), r[1].view(), r[2].view(), r[3].view(),
                                               xh.view(), targets.view(), wh.view(), 1.0f,
                                               r[4].view(), ctx);
        return r;
    });

    const int64_t P = 100000;
    HostTensor g = random_tensor(rng, Shape{P});
    expect_thread_count_independent("grad_norm_l2 + adamw_update", [&] {
        std::vector<HostTensor> r;
        r.push_back(f32(Shape{1}));
        const ConstTensorView grads[] = {g.view()};
        grad_norm_l2(r[0].view(), grads, ctx);
        r.push_back(copy_tensor(g.view()));  // params
        r.push_back(f32(Shape{P}));
        r.push_back(f32(Shape{P}));
        const AdamWSegment seg[] = {{0, P, 1e-3, 0.1}};
        adamw_update(r[1].view(), r[2].view(), r[3].view(), g.view(), seg, AdamWHyper{}, 1, ctx);
        return r;
    });
}

}  // namespace
}  // namespace lathe::optest
