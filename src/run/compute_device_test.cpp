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
    EXPECT_EQ(b.status().message(), "train.device: 'tpu'; choose auto, cpu or cuda");
}

// The build's own answer agrees with how it was configured.
TEST(ComputeDeviceChoose, BuildReportsAttention) {
    EXPECT_EQ(attention_unavailable_reason(Backend::kCpu), nullptr);
#if defined(LATHE_HAVE_CUDA)
    const char* cuda = attention_unavailable_reason(Backend::kCuda);
    // ops/cuda/attention.cu answers from LATHE_HAVE_CUDNN_FRONTEND, which only lathe_ops sees;
    // either answer is valid here, but a missing one must say how to get it.
    if (cuda != nullptr)
        EXPECT_NE(std::string(cuda).find("install-deps.sh"), std::string::npos) << cuda;
#else
    EXPECT_NE(attention_unavailable_reason(Backend::kCuda), nullptr);
#endif
}

}  // namespace
}  // namespace lathe
