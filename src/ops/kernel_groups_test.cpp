#include "ops/kernel_groups.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace lathe {
namespace {

TEST(KernelGroups, NamesOfTheLibrariesAndOfLatheGoToTheirGroups) {
    // Kernel names as CUPTI reports them on an H100 (cuBLASLt's Hopper matmuls are nvjet_*,
    // cuDNN's fused attention carries sm90 and wgmma in its name, NCCL's are ncclDevKernel_*).
    EXPECT_EQ(kernel_group("nvjet_tst_192x192_64x3_2x1_v_bz_coopA_TNN"), "gemm");
    EXPECT_EQ(kernel_group("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"), "gemm");
    EXPECT_EQ(kernel_group("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu>"), "gemm");
    EXPECT_EQ(kernel_group("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3"),
              "attention");
    EXPECT_EQ(kernel_group("void lathe::cuda::(anonymous namespace)::decode_split_kernel<128>()"),
              "attention");
    EXPECT_EQ(kernel_group("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage)"),
              "communication");
    EXPECT_EQ(kernel_group("void lathe::cuda::adamw_update_kernel<float>(...)"), "optimizer");
    EXPECT_EQ(kernel_group("sum_of_squares_partials_kernel"), "optimizer");
    EXPECT_EQ(kernel_group("void lathe::cuda::held_row_kernel<256>(...)"), "lm_head_ce");
    EXPECT_EQ(kernel_group("rmsnorm_forward_warp_per_row_kernel"), "norms");
    EXPECT_EQ(kernel_group("rmsnorm_backward_fused_kernel"), "norms");
    EXPECT_EQ(kernel_group("void lathe::cuda::cast_transpose_kernel<__nv_bfloat16>()"),
              "fp8_casts");
    EXPECT_EQ(kernel_group("void lathe::cuda::cast_kernel<__nv_fp8_e4m3>()"), "fp8_casts");
    EXPECT_EQ(kernel_group("amax_kernel"), "fp8_casts");
    EXPECT_EQ(kernel_group("void lathe::cuda::cast_f32_to_bf16_kernel()"), "elementwise");
    EXPECT_EQ(kernel_group("swiglu_forward_kernel"), "elementwise");
    EXPECT_EQ(kernel_group("rope_rotate_pair_per_thread_kernel"), "elementwise");
    EXPECT_EQ(kernel_group("some_library_kernel"), "other");
    EXPECT_EQ(kernel_group("memcpy", true), "copies");
}

TEST(KernelGroups, BusyIsTheUnionOfIntervalsAndGapsAreTheRest) {
    // Two overlapping kernels on two streams (0-4 ms and 2-6 ms), a gap, then a copy (8-9 ms).
    const std::vector<KernelRecord> records = {
        {"nvjet_a", 0, 4'000'000, false},
        {"rmsnorm_forward_warp_per_row_kernel", 2'000'000, 6'000'000, false},
        {"memcpy", 8'000'000, 9'000'000, true},
        {"nvjet_a", 9'000'000, 9'500'000, false},
    };
    const KernelBreakdown b = summarize_kernels(records, 2);
    EXPECT_DOUBLE_EQ(b.span_ms, 9.5);
    EXPECT_DOUBLE_EQ(b.busy_ms, 7.5);  // [0,6) + [8,9.5)
    ASSERT_EQ(b.groups.size(), 3u);
    EXPECT_EQ(b.groups[0].name, "gemm");
    EXPECT_DOUBLE_EQ(b.groups[0].ms, 4.5);
    EXPECT_EQ(b.groups[0].count, 2);
    EXPECT_EQ(b.groups[1].name, "norms");
    EXPECT_EQ(b.groups[2].name, "copies");
    ASSERT_EQ(b.top.size(), 2u);
    EXPECT_EQ(b.top[0].name, "nvjet_a");
    EXPECT_EQ(b.top[1].name, "rmsnorm_forward_warp_per_row_kernel");
}

TEST(KernelGroups, EachGapIsChargedToTheRecordThatEndsIt) {
    // Records out of start order (as CUPTI's buffers may hold them): idle 1 ms before the second
    // nvjet_b, 2 ms before the copy, 0.5 ms before the norm; none before the first record or one
    // that starts inside the busy stretch.
    const std::vector<KernelRecord> records = {
        {"memcpy", 7'000'000, 8'000'000, true},
        {"nvjet_b", 0, 2'000'000, false},
        {"rmsnorm_forward_block_per_row_kernel", 8'500'000, 9'000'000, false},
        {"nvjet_b", 3'000'000, 5'000'000, false},
        {"swiglu_forward_kernel", 4'000'000, 4'500'000, false},
    };
    const KernelBreakdown b = summarize_kernels(records, 3);
    EXPECT_DOUBLE_EQ(b.span_ms, 9.0);
    EXPECT_DOUBLE_EQ(b.busy_ms, 5.5);  // [0,2) + [3,5) + [7,8) + [8.5,9)
    ASSERT_EQ(b.by_gap.size(), 3u);
    EXPECT_EQ(b.by_gap[0].name, "memcpy");
    EXPECT_DOUBLE_EQ(b.by_gap[0].gap_ms, 2.0);
    EXPECT_EQ(b.by_gap[1].name, "nvjet_b");
    EXPECT_DOUBLE_EQ(b.by_gap[1].gap_ms, 1.0);
    EXPECT_EQ(b.by_gap[2].name, "rmsnorm_forward_block_per_row_kernel");
    EXPECT_DOUBLE_EQ(b.by_gap[2].gap_ms, 0.5);
    double group_gaps = 0;
    for (const KernelTotal& g : b.groups) group_gaps += g.gap_ms;
    EXPECT_DOUBLE_EQ(group_gaps, b.span_ms - b.busy_ms);
}

TEST(KernelGroups, TheTraceHasAnEventPerRecordOnItsStreamsTrack) {
    // An update on stream 20 beside a GEMM on stream 7, then a copy back on stream 7.
    const std::vector<KernelRecord> records = {
        {"nvjet_tst_192x192", 5'000'000, 5'004'000, false, 7},
        {"void lathe::cuda::adamw_update_kernel<float>(...)", 5'001'500, 5'003'250, false, 20},
        {"memcpy", 5'004'500, 5'004'501, true, 7},
    };
    const auto j = nlohmann::json::parse(kernel_trace_json(records));
    const auto& ev = j.at("traceEvents");
    ASSERT_EQ(ev.size(), 5u);  // two thread names, three records
    EXPECT_EQ(ev[0].at("ph"), "M");
    EXPECT_EQ(ev[0].at("tid"), 7);
    EXPECT_EQ(ev[0].at("args").at("name"), "stream 7");
    EXPECT_EQ(ev[1].at("tid"), 20);
    EXPECT_EQ(ev[1].at("args").at("name"), "stream 20");
    EXPECT_EQ(ev[2].at("name"), "nvjet_tst_192x192");
    EXPECT_EQ(ev[2].at("cat"), "gemm");
    EXPECT_EQ(ev[2].at("ph"), "X");
    EXPECT_DOUBLE_EQ(ev[2].at("ts").get<double>(), 0.0);  // microseconds from the first start
    EXPECT_DOUBLE_EQ(ev[2].at("dur").get<double>(), 4.0);
    EXPECT_EQ(ev[2].at("tid"), 7);
    EXPECT_EQ(ev[3].at("cat"), "optimizer");
    EXPECT_DOUBLE_EQ(ev[3].at("ts").get<double>(), 1.5);
    EXPECT_DOUBLE_EQ(ev[3].at("dur").get<double>(), 1.75);
    EXPECT_EQ(ev[3].at("tid"), 20);
    EXPECT_EQ(ev[4].at("cat"), "copies");
    EXPECT_DOUBLE_EQ(ev[4].at("dur").get<double>(), 0.001);
    EXPECT_EQ(j.at("displayTimeUnit"), "ns");
    // No records: an empty trace, still one that a viewer opens.
    const auto empty = nlohmann::json::parse(kernel_trace_json({}));
    EXPECT_TRUE(empty.at("traceEvents").empty());
}

TEST(KernelGroups, NoRecordsGiveAnEmptyBreakdown) {
    const KernelBreakdown b = summarize_kernels({}, 5);
    EXPECT_EQ(b.span_ms, 0);
    EXPECT_TRUE(b.groups.empty());
}

}  // namespace
}  // namespace lathe
