#include "run/compute_device.h"

#include <gtest/gtest.h>

#include "ops/attention.h"

namespace lathe {
namespace {

// A machine with one GPU this build has kernels for.
GpuEnvironment machine_with_gpu() {
    GpuEnvironment env;
    env.cuda_build = true;
    GpuDeviceInfo g;
    g.name = "NVIDIA H100 80GB HBM3";
    g.cc_major = 9;
    g.kernel_image_ok = true;
    env.devices.push_back(g);
    return env;
}

constexpr const char* kNoAttention =
    "this build has no CUDA attention: it was configured without the cuDNN frontend headers";

TEST(ComputeDeviceChoose, GpuWithAttention) {
    std::string note;
    for (const char* want : {"auto", "cuda"}) {
        auto b = compute_device_choose(want, "train.device", machine_with_gpu(), nullptr, note);
        ASSERT_TRUE(b.ok()) << b.status().to_string();
        EXPECT_EQ(*b, Backend::kCuda) << want;
        EXPECT_EQ(note, "");
    }
    auto cpu = compute_device_choose("cpu", "train.device", machine_with_gpu(), nullptr, note);
    ASSERT_TRUE(cpu.ok());
    EXPECT_EQ(*cpu, Backend::kCpu);
}

TEST(ComputeDeviceChoose, AutoSkipsAGpuWithoutAttention) {
    std::string note;
    auto b = compute_device_choose("auto", "train.device", machine_with_gpu(), kNoAttention, note);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(*b, Backend::kCpu);
    EXPECT_NE(note.find("train.device: auto: this build has no CUDA attention"), std::string::npos)
        << note;
    EXPECT_NE(note.find("computing on the CPU"), std::string::npos) << note;
}

TEST(ComputeDeviceChoose, CudaWithoutAttentionIsRefusedSayingWhy) {
    std::string note;
    auto b = compute_device_choose("cuda", "train.device", machine_with_gpu(), kNoAttention, note);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
    const std::string& m = b.status().message();
    EXPECT_NE(m.find("train.device: cuda, but this build has no CUDA attention"), std::string::npos)
        << m;
    EXPECT_NE(m.find("run scripts/install-deps.sh and rebuild"), std::string::npos) << m;
}

TEST(ComputeDeviceChoose, NoUsableGpu) {
    GpuEnvironment none;
    none.no_gpu = true;
    none.device_error = "no CUDA-capable device is detected";
    std::string note;
    auto a = compute_device_choose("auto", "--device", none, nullptr, note);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, Backend::kCpu);
    EXPECT_EQ(note, "");  // no GPU at all is no news
    auto c = compute_device_choose("cuda", "--device", none, nullptr, note);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("--device: cuda, but no CUDA-capable device"),
              std::string::npos)
        << c.status().message();

    GpuEnvironment ampere = machine_with_gpu();
    ampere.devices[0].cc_major = 8;
    ampere.devices[0].kernel_image_ok = false;
    ampere.devices[0].kernel_image_error = "no kernel image is available";
    auto fallback = compute_device_choose("auto", "--device", ampere, nullptr, note);
    ASSERT_TRUE(fallback.ok());
    EXPECT_EQ(*fallback, Backend::kCpu);
    EXPECT_NE(note.find("this build has no kernels for GPU 0"), std::string::npos) << note;
}

TEST(ComputeDeviceChoose, UnknownValue) {
    std::string note;
    auto b = compute_device_choose("tpu", "train.device", machine_with_gpu(), nullptr, note);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().message(),
              "train.device: 'tpu'; choose auto, cpu or cuda (cuda:N for GPU N)");
    for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda:1 ", "CUDA", "cuda:1:2"}) {
        EXPECT_FALSE(compute_device_name_valid(bad)) << bad;
        EXPECT_FALSE(
            compute_device_choose(bad, "train.device", machine_with_gpu(), nullptr, note).ok())
            << bad;
    }
}

// cuda:N is a request for CUDA (the device index is compute_device_index's).
TEST(ComputeDeviceChoose, ExplicitDeviceIsCuda) {
    std::string note;
    for (const char* want : {"cuda:0", "cuda:3", "cuda:12"}) {
        EXPECT_TRUE(compute_device_name_valid(want)) << want;
        auto b = compute_device_choose(want, "train.device", machine_with_gpu(), nullptr, note);
        ASSERT_TRUE(b.ok()) << b.status().to_string();
        EXPECT_EQ(*b, Backend::kCuda) << want;
    }
    auto refused =
        compute_device_choose("cuda:1", "train.device", machine_with_gpu(), kNoAttention, note);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("train.device: cuda, but"), std::string::npos);
}

ProcessGroupInfo torchrun_rank(int rank, int world, int local_rank) {
    auto g = process_group_from_env({{"RANK", std::to_string(rank)},
                                     {"WORLD_SIZE", std::to_string(world)},
                                     {"LOCAL_RANK", std::to_string(local_rank)}});
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return *g;
}

// auto and cuda take GPU <local rank>, not GPU 0: the ranks of one machine spread over its GPUs.
TEST(ComputeDeviceIndex, LocalRankPicksTheGpu) {
    for (const char* want : {"auto", "cuda"}) {
        EXPECT_EQ(*compute_device_index(want, "train.device", ProcessGroupInfo{}, 8), 0);
        for (int local = 0; local < 4; ++local) {
            auto d =
                compute_device_index(want, "train.device", torchrun_rank(4 + local, 8, local), 4);
            ASSERT_TRUE(d.ok()) << d.status().to_string();
            EXPECT_EQ(*d, local) << want;
        }
    }
}

// A launcher that shows each process only its own GPU: the one visible device.
TEST(ComputeDeviceIndex, OneVisibleGpuPerProcess) {
    auto d = compute_device_index("auto", "train.device", torchrun_rank(3, 4, 3), 1);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(*d, 0);
}

TEST(ComputeDeviceIndex, TooFewGpusForTheLocalRank) {
    auto d = compute_device_index("cuda", "train.device", torchrun_rank(5, 8, 5), 4);
    ASSERT_FALSE(d.ok());
    const std::string& m = d.status().message();
    EXPECT_NE(m.find("rank 5 of 8 (local rank 5, torchrun), but only 4 GPUs are visible"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("train.device: cuda:N"), std::string::npos) << m;
}

// cuda:N is explicit: the process group does not change it.
TEST(ComputeDeviceIndex, ExplicitDeviceStays) {
    auto d = compute_device_index("cuda:2", "train.device", torchrun_rank(1, 2, 1), 4);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(*d, 2);
    auto beyond = compute_device_index("cuda:4", "--device", ProcessGroupInfo{}, 4);
    ASSERT_FALSE(beyond.ok());
    EXPECT_NE(beyond.status().message().find("--device: cuda:4, but 4 GPUs are visible"),
              std::string::npos)
        << beyond.status().message();
    EXPECT_NE(beyond.status().message().find("choose cuda:0 to cuda:3"), std::string::npos);
    EXPECT_FALSE(compute_device_index("cpu", "--device", ProcessGroupInfo{}, 4).ok());
}

// The build's own answer agrees with how it was configured.
TEST(ComputeDeviceChoose, BuildReportsAttention) {
    EXPECT_EQ(attention_unavailable_reason(Backend::kCpu), nullptr);
#if defined(LATHE_HAVE_CUDA)
    const char* cuda = attention_unavailable_reason(Backend::kCuda);
    // ops/cuda/attention.cu answers from LATHE_HAVE_CUDNN_FRONTEND, which only lathe_ops sees;
    // either answer is valid here, but a missing one must say how to get it.
    if (cuda != nullptr) {
        EXPECT_NE(std::string(cuda).find("install-deps.sh"), std::string::npos) << cuda;
    }
#else
    EXPECT_NE(attention_unavailable_reason(Backend::kCuda), nullptr);
#endif
}

}  // namespace
}  // namespace lathe
