// AdamWOptimizer on CUDA (CTest label gpu): over a GPU model, the same bits as the AdamW op on
// moments beside the model (masters, bf16 compute copy and moments, with clipping by the norm in
// device memory); shards over a partition giving the bits of one optimizer; the state read back
// from the device, round-tripped through optimizer.safetensors; and a step allocating nothing.
// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/adamw_moments_test_util.h"
#include "optim/adamw_optimizer.h"
#include "optim/optimizer_gpu_test_util.h"
#include "optim/optimizer_state.h"

namespace lathe {
namespace {

using namespace optim_gpu_test;

class AdamWOptimizerGpu : public CudaSuite {
protected:
    Model make_model() {
        Model m = make_llama(state_->context(), 2);
        m.init(3);
        return m;
    }

    // Gradients of a batch that depends on `salt`, and their norm left in device memory.
    static void gradients(Model& m, int salt) {
        const SaltedBatch b = salted_batch(salt);
        m.zero_grads();
        m.forward_backward(b.batch());
        m.grad_norm();
    }

    std::vector<uint8_t> bytes(ConstTensorView v) const { return device_bytes(v, *state_); }
};

TEST_F(AdamWOptimizerGpu, StepsAModelAsTheOpDoesAndShardsAgree) {
    Model a = make_model(), b = make_model(), c = make_model();
    Result<AdamWOptimizer> whole = AdamWOptimizer::create_for(a);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    TestAdamWMoments op = TestAdamWMoments::of(b);
    const int64_t P = c.params_flat().numel();
    std::vector<AdamWOptimizer> shards;
    for (int r = 0; r < 3; ++r) {
        Result<AdamWOptimizer> s =
            AdamWOptimizer::create_for(c, flat_shard(P, r, 3), state_->context());
        ASSERT_TRUE(s.ok());
        shards.push_back(std::move(*s));
    }
    const AdamWHyper hyper{0.9, 0.95, 1e-8};
    for (int step = 1; step <= 3; ++step) {
        for (Model* m : {&a, &b, &c}) gradients(*m, step);
        const auto segs = a.adamw_segments(1e-2, 0.1);
        whole->step(optimizer_target(a), segs, hyper, step, 0.05f);
        op.step(b, segs, hyper, step, 0.05f);
        for (AdamWOptimizer& s : shards) s.step(optimizer_target(c), segs, hyper, step, 0.05f);
    }
    const std::vector<uint8_t> pa = bytes(a.params_flat());
    EXPECT_EQ(pa, bytes(b.params_flat()));
    EXPECT_EQ(pa, bytes(c.params_flat()));
    EXPECT_EQ(bytes(a.params_compute_flat()), bytes(b.params_compute_flat()));
    EXPECT_EQ(bytes(a.params_compute_flat()), bytes(c.params_compute_flat()));
    EXPECT_EQ(bytes(whole->exp_avg()), bytes(op.exp_avg.flat_f32()));
    EXPECT_EQ(bytes(whole->exp_avg_sq()), bytes(op.exp_avg_sq.flat_f32()));
    std::vector<uint8_t> m, v;
    for (const AdamWOptimizer& s : shards) {
        const std::vector<uint8_t> sm = bytes(s.exp_avg()), sv = bytes(s.exp_avg_sq());
        m.insert(m.end(), sm.begin(), sm.end());
        v.insert(v.end(), sv.begin(), sv.end());
    }
    EXPECT_EQ(bytes(whole->exp_avg()), m);
    EXPECT_EQ(bytes(whole->exp_avg_sq()), v);
    // The parameters moved.
    Model fresh = make_model();
    EXPECT_NE(pa, bytes(fresh.params_flat()));
}

// The moments read back from the device, through optimizer.safetensors, into a new optimizer.
TEST_F(AdamWOptimizerGpu, StateRoundTripsThroughTheFile) {
    Model a = make_model();
    Result<AdamWOptimizer> opt = AdamWOptimizer::create_for(a);
    ASSERT_TRUE(opt.ok());
    gradients(a, 1);
    opt->step(optimizer_target(a), a.adamw_segments(1e-3, 0.0), AdamWHyper{}, 1, 1.0f);
    const size_t n = size_t(opt->total());
    std::vector<float> m1(n), v1(n);
    opt->read_state(m1, v1);
    EXPECT_NE(m1, std::vector<float>(n, 0.0f));
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("lathe_optim_gpu_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "optimizer.safetensors").string();
    ASSERT_TRUE(optimizer_state_save(*opt, path).ok());
    Result<AdamWOptimizer> back = AdamWOptimizer::create_for(a);
    ASSERT_TRUE(back.ok());
    ASSERT_TRUE(optimizer_state_load(*back, path).ok());
    std::vector<float> m2(n), v2(n);
    back->read_state(m2, v2);
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(v1, v2);
    std::filesystem::remove_all(dir);
}

TEST_F(AdamWOptimizerGpu, AStepAllocatesNoDeviceMemory) {
    Model a = make_model();
    Result<AdamWOptimizer> opt = AdamWOptimizer::create_for(a);
    ASSERT_TRUE(opt.ok());
    auto step = [&](int s) {
        gradients(a, s);
        opt->step(optimizer_target(a), a.adamw_segments(1e-3, 0.1), AdamWHyper{}, s, 1.0f);
        a.synchronize();
    };
    step(1);  // first use builds the cached attention graphs and GEMM choices
    const size_t before = cuda_memory_info(0).free_bytes;
    for (int s = 2; s <= 4; ++s) step(s);
    EXPECT_EQ(cuda_memory_info(0).free_bytes, before);
}

}  // namespace
}  // namespace lathe
