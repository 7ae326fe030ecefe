#include "model/host_memory_plan.h"

#include <gtest/gtest.h>

#include "model/memory_plan.h"
#include "model/registry.h"
#include "model/tiny_model_test_util.h"

namespace lathe {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

const char* kMeminfo =
    "MemTotal:       263921344 kB\n"
    "MemFree:         1234567 kB\n"
    "MemAvailable:   200000000 kB\n"
    "Buffers:          102400 kB\n";

TEST(HostMemoryPlan, Llama8BFullOffloadBytes) {
    // Llama-3.1-8B: 8030261248 parameters.
    const int64_t P = 8030261248;
    OffloadSettings s;
    s.offload = OptimizerOffload::kCpu;
    auto plan = host_memory_plan(P, 0, s);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->offloaded_params, P);
    EXPECT_EQ(plan->master_bytes, 4 * P);
    EXPECT_EQ(plan->moment_bytes, 8 * P);
    EXPECT_EQ(plan->grad_landing_bytes, 4 * P);
    EXPECT_EQ(plan->weight_staging_bytes, 2 * P);
    EXPECT_EQ(plan->pinned_bytes(), 18 * P);
    EXPECT_EQ(plan->gpu_bytes_saved, 12 * P);
    s.state_dtype = AdamWStateDType::kBF16;
    plan = host_memory_plan(P, 0, s);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->moment_bytes, 4 * P);
    EXPECT_EQ(plan->pinned_bytes(), 14 * P);
    EXPECT_EQ(plan->gpu_bytes_saved, 12 * P);  // the GPU held f32 moments either way
    EXPECT_NE(plan->to_string().find("total pinned"), std::string::npos);
}

TEST(HostMemoryPlan, SplitCountsTheMirrorAndIsChecked) {
    OffloadSettings s;
    s.offload = OptimizerOffload::kCpu;
    s.fraction = 0.25;
    auto plan = host_memory_plan(10, 7, s);  // elements [7, 10) offloaded
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->offloaded_params, 3);
    EXPECT_EQ(plan->master_mirror_bytes, 4 * 7);
    EXPECT_EQ(plan->pinned_bytes(), 18 * 3 + 4 * 7);
    EXPECT_EQ(plan->gpu_bytes_saved, 12 * 3);
    EXPECT_NE(plan->to_string().find("master mirror (f32, GPU part)"), std::string::npos);
    EXPECT_FALSE(host_memory_plan(10, 11, s).ok());
    EXPECT_FALSE(host_memory_plan(10, -1, s).ok());
    for (double bad : {0.0, -0.5, 1.0000001, std::nan("")}) {
        s.fraction = bad;
        auto r = host_memory_plan(10, 0, s);
        ASSERT_FALSE(r.ok()) << bad;
        EXPECT_NE(r.status().message().find("'optimizer.offload_fraction' must be in (0, 1]"),
                  std::string::npos)
            << r.status().message();
    }
    s.offload = OptimizerOffload::kNone;
    s.fraction = 1.0;
    plan = host_memory_plan(10, 0, s);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->pinned_bytes(), 0);
    EXPECT_EQ(plan->gpu_bytes_saved, 0);
}

TEST(HostMemoryPlan, MeminfoWithoutCgroup) {
    auto a = host_memory_available_from(kMeminfo, "", "", "", "");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(a->mem_available, int64_t(200000000) * 1024);
    EXPECT_FALSE(a->cgroup_room.has_value());
    EXPECT_EQ(a->bytes(), int64_t(200000000) * 1024);
    // v2 "max" is no limit.
    a = host_memory_available_from(kMeminfo, "max\n", "123\n", "", "");
    ASSERT_TRUE(a.ok());
    EXPECT_FALSE(a->cgroup_room.has_value());
}

TEST(HostMemoryPlan, CgroupLimitsLowerTheRoom) {
    // v2: 64 GiB limit, 10 GiB used.
    auto a = host_memory_available_from(kMeminfo, std::to_string(64 * kGiB) + "\n",
                                        std::to_string(10 * kGiB) + "\n", "", "");
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(a->cgroup_room.has_value());
    EXPECT_EQ(a->bytes(), 54 * kGiB);
    // v1: 32 GiB limit, 2 GiB used.
    a = host_memory_available_from(kMeminfo, "", "", std::to_string(32 * kGiB),
                                   std::to_string(2 * kGiB));
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->bytes(), 30 * kGiB);
    // v1's "unlimited" is a number above the machine's memory.
    a = host_memory_available_from(kMeminfo, "", "", "9223372036854771712\n", "5000\n");
    ASSERT_TRUE(a.ok());
    EXPECT_FALSE(a->cgroup_room.has_value());
    // A limit far above MemAvailable leaves MemAvailable the bound.
    a = host_memory_available_from(kMeminfo, std::to_string(1000 * kGiB), "0", "", "");
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->bytes(), int64_t(200000000) * 1024);
}

TEST(HostMemoryPlan, BadFilesAreErrors) {
    EXPECT_FALSE(host_memory_available_from("MemTotal: 100 kB\n", "", "", "", "").ok());
    EXPECT_FALSE(host_memory_available_from("MemAvailable: lots kB\n", "", "", "", "").ok());
    EXPECT_FALSE(host_memory_available_from("MemAvailable: 100 MB\n", "", "", "", "").ok());
    EXPECT_FALSE(host_memory_available_from(kMeminfo, "12x\n", "0", "", "").ok());
}

TEST(HostMemoryPlan, SplitOffloadsTheFewestLastUnitsHoldingTheFraction) {
    ShardLayout units;  // front 40, layers 20 and 30, back 10: 100 elements
    units.arena = {FlatRange{0, 40}, FlatRange{40, 60}, FlatRange{60, 90}, FlatRange{90, 100}};
    EXPECT_EQ(offload_split_begin(units, 1.0), 0);
    EXPECT_EQ(offload_split_begin(units, 0.1), 90);    // 10 >= ceil(10)
    EXPECT_EQ(offload_split_begin(units, 0.101), 60);  // 11 needs the last layer too: 40
    EXPECT_EQ(offload_split_begin(units, 0.4), 60);
    EXPECT_EQ(offload_split_begin(units, 0.41), 40);  // 41 > 40: 60
    EXPECT_EQ(offload_split_begin(units, 0.6), 40);
    EXPECT_EQ(offload_split_begin(units, 0.61), 0);   // every unit
    EXPECT_EQ(offload_split_begin(units, 1e-9), 90);  // ceil(1e-7) = 1: the back unit
    // 0.07 * 100 is 7.000000000000001 in fp64: still 7 elements, the back unit alone.
    ShardLayout small;  // front 93, back 7
    small.arena = {FlatRange{0, 93}, FlatRange{93, 100}};
    EXPECT_EQ(offload_split_begin(small, 0.07), 93);
}

TEST(HostMemoryPlan, DevicePlanCountsTheMastersAndMomentsItKeeps) {
    const ModelConfig c = tiny_model::parse(tiny_model::kLlamaJson);
    const ParamTable table = model_param_table(c);
    ModelShape shape;
    shape.batch = 2;
    shape.seq_len = 8;
    shape.backend = Backend::kCuda;  // planned only: no GPU needed
    shape.masters_on_host = true;
    Result<MemoryPlan> whole = memory_plan_make(c, table, shape);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    EXPECT_EQ(whole->offload_begin, 0);
    EXPECT_EQ(whole->optimizer_bytes(), 0u);
    shape.offload_fraction = 0.5;
    Result<MemoryPlan> half = memory_plan_make(c, table, shape);
    ASSERT_TRUE(half.ok()) << half.status().to_string();
    const int64_t P = half->shards.total, o = half->offload_begin;
    EXPECT_GT(o, 0);
    EXPECT_LE(o, P / 2);  // the offloaded P - o >= ceil(P / 2)
    // Its split is a unit boundary.
    bool boundary = false;
    for (const FlatRange& u : half->shards.arena) boundary |= u.begin == o;
    EXPECT_TRUE(boundary);
    EXPECT_EQ(half->optimizer_bytes(), size_t(8 * o));
    EXPECT_EQ(half->parameter_bytes(), whole->parameter_bytes() + size_t(4 * o));
    EXPECT_EQ(half->total_bytes(), whole->total_bytes() + size_t(12 * o));
    EXPECT_NE(half->table("t").find("offload_fraction 0.5"), std::string::npos);
    // bf16 moments (optimizer.state_dtype): the device part's two moments at 2 B each.
    shape.optimizer_state = AdamWStateDType::kBF16;
    Result<MemoryPlan> half16 = memory_plan_make(c, table, shape);
    ASSERT_TRUE(half16.ok()) << half16.status().to_string();
    EXPECT_EQ(half16->offload_begin, o);
    EXPECT_EQ(half16->optimizer_bytes(), size_t(4 * o));
    EXPECT_NE(half16->table("t").find("optimizer state (m, v in bf16)"), std::string::npos);
    shape.optimizer_state = AdamWStateDType::kF32;
    shape.offload_fraction = 0.0;
    EXPECT_FALSE(memory_plan_make(c, table, shape).ok());
}

TEST(HostMemoryPlan, CheckRefusesWithNumbers) {
    OffloadSettings s;
    s.offload = OptimizerOffload::kCpu;
    auto plan = host_memory_plan(8030261248, 0, s);  // 18 B x 8.03e9 = 134.6 GiB pinned
    ASSERT_TRUE(plan.ok());
    auto roomy = host_memory_available_from(kMeminfo, "", "", "", "");  // 190.7 GiB
    ASSERT_TRUE(roomy.ok());
    EXPECT_TRUE(host_memory_check(*plan, *roomy).ok());
    auto tight = host_memory_available_from(kMeminfo, std::to_string(100 * kGiB), "0", "", "");
    ASSERT_TRUE(tight.ok());
    const Status st = host_memory_check(*plan, *tight);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("needs 134.62 GiB of pinned host memory"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("100.00 GiB available (the room under the cgroup v2 memory.max "
                                "limit)"),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("lower optimizer.offload_fraction or use "
                                "optimizer.state_dtype: bf16"),
              std::string::npos);
    // bf16 moments: 14 B x 8.03e9 = 104.7 GiB, still above 100; half offloaded fits (14 B x
    // 4.02e9 and the 4 B mirror of the other half: 67.3 GiB).
    s.state_dtype = AdamWStateDType::kBF16;
    plan = host_memory_plan(8030261248, 0, s);
    EXPECT_FALSE(host_memory_check(*plan, *tight).ok());
    s.fraction = 0.5;
    plan = host_memory_plan(8030261248, 8030261248 / 2, s);
    EXPECT_TRUE(host_memory_check(*plan, *tight).ok());
}

TEST(HostMemoryPlan, ThisHostReads) {
    // Whatever this machine has: /proc/meminfo exists on Linux and gives a positive amount.
    auto a = host_memory_available();
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_GT(a->bytes(), 0);
}

}  // namespace
}  // namespace lathe
