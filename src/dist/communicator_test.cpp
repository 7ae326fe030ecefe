#include "dist/communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "dist/mpi_communicator.h"
#include "dist/open.h"

namespace lathe {
namespace {

std::vector<float> iota_f32(size_t n, float start) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = start + 0.5f * float(i);
    return v;
}

TensorView view_of(std::vector<float>& v) {
    return TensorView(v.data(), DType::kF32, {int64_t(v.size())});
}

TEST(LocalCommunicator, IsRankZeroOfOne) {
    LocalCommunicator comm;
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(comm.backend(), "local");
    EXPECT_TRUE(comm.accepts(Device::kCpu));
}

// One rank: every reduction is the identity (avg divides by one), gathers and scatters copy.
TEST(LocalCommunicator, CollectivesAreTheIdentity) {
    LocalCommunicator comm;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
        std::vector<float> in = iota_f32(7, -1.25f), out(7, -99.0f);
        ASSERT_TRUE(comm.all_reduce(view_of(out), view_of(in), op, nullptr).ok());
        EXPECT_EQ(out, in) << reduce_op_name(op);
        std::vector<float> scattered(7, -99.0f);
        ASSERT_TRUE(comm.reduce_scatter(view_of(scattered), view_of(in), op, nullptr).ok());
        EXPECT_EQ(scattered, in) << reduce_op_name(op);
        // In place: nothing moves.
        const std::vector<float> before = in;
        ASSERT_TRUE(comm.all_reduce(view_of(in), view_of(in), op, nullptr).ok());
        EXPECT_EQ(in, before);
    }
    std::vector<float> in = iota_f32(5, 3.0f), out(5, 0.0f);
    ASSERT_TRUE(comm.all_gather(view_of(out), view_of(in), nullptr).ok());
    EXPECT_EQ(out, in);
    std::vector<int32_t> ids = {4, 5, 6}, gathered(3, 0);  // gathers move any dtype
    ASSERT_TRUE(comm.all_gather(TensorView(gathered.data(), DType::kI32, {3}),
                                TensorView(ids.data(), DType::kI32, {3}), nullptr)
                    .ok());
    EXPECT_EQ(gathered, ids);
    std::vector<float> buf = iota_f32(4, 1.0f);
    const std::vector<float> kept = buf;
    ASSERT_TRUE(comm.broadcast(view_of(buf), 0, nullptr).ok());
    EXPECT_EQ(buf, kept);
    // bf16 takes the same path.
    std::vector<uint16_t> h = {0x3f80, 0x4000, 0xc040}, hout(3, 0);
    ASSERT_TRUE(comm.all_reduce(TensorView(hout.data(), DType::kBF16, {3}),
                                TensorView(h.data(), DType::kBF16, {3}), ReduceOp::kSum, nullptr)
                    .ok());
    EXPECT_EQ(hout, h);
}

TEST(LocalCommunicator, SplitGivesAnotherLocalOrNone) {
    LocalCommunicator comm;
    auto sub = comm.split(3, 0);
    ASSERT_TRUE(sub.ok());
    ASSERT_NE(sub->get(), nullptr);
    EXPECT_EQ((*sub)->size(), 1);
    EXPECT_EQ((*sub)->backend(), "local");
    auto none = comm.split(Communicator::kNoColor, 0);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(none->get(), nullptr);
}

TEST(CommunicatorOpen, OneProcessIsLocal) {
    ProcessGroupInfo one;
    for (Backend b : {Backend::kCpu, Backend::kCuda}) {
        auto comm = communicator_open(one, b, 0);
        ASSERT_TRUE(comm.ok()) << comm.status().to_string();
        EXPECT_EQ((*comm)->backend(), "local");
    }
}

TEST(CommunicatorOpen, RendezvousPortSkipsTorchrunsStore) {
    ProcessGroupInfo g;
    EXPECT_EQ(rendezvous_port(g), 0);
    g.master_port = 29500;
    g.launcher = Launcher::kSlurm;
    EXPECT_EQ(rendezvous_port(g), 29500);
    g.launcher = Launcher::kTorchrun;
    EXPECT_EQ(rendezvous_port(g), 29501);
}

// The build's answer agrees with how it was configured (CMake defines LATHE_HAVE_MPI for this
// test when it found MPI); without MPI a CPU world of two says what to install. With MPI the
// collectives are checked by dist_mpi_tests under mpirun.
TEST(CommunicatorOpen, MpiAsBuilt) {
#if LATHE_HAVE_MPI
    EXPECT_TRUE(mpi_available());
#else
    EXPECT_FALSE(mpi_available());
    ProcessGroupInfo g;
    g.launcher = Launcher::kMpirun;
    g.world_size = 2;
    auto comm = communicator_open(g, Backend::kCpu, 0);
    ASSERT_FALSE(comm.ok());
    EXPECT_NE(comm.status().message().find("install libopenmpi-dev"), std::string::npos);
    auto direct = mpi_world_communicator();
    ASSERT_FALSE(direct.ok());
    EXPECT_NE(direct.status().message().find("built without MPI"), std::string::npos);
#endif
}

class CommunicatorDeathTest : public ::testing::Test {
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CommunicatorDeathTest, MisuseStops) {
    LocalCommunicator comm;
    std::vector<float> a(4), b(5);
    EXPECT_DEATH((void)comm.all_reduce(view_of(a), view_of(b), ReduceOp::kSum, nullptr),
                 "all_reduce: out .* and in .* differ in size");
    EXPECT_DEATH((void)comm.all_gather(view_of(a), view_of(b), nullptr),
                 "all_gather: out .* must hold 1 chunks");
    EXPECT_DEATH((void)comm.broadcast(view_of(a), 1, nullptr), "broadcast: root 1 of a group of 1");
    std::vector<int32_t> ids(4);
    EXPECT_DEATH(
        (void)comm.all_reduce(TensorView(ids.data(), DType::kI32, {4}),
                              TensorView(ids.data(), DType::kI32, {4}), ReduceOp::kSum, nullptr),
        "reductions take f32 or bf16");
    std::vector<float> c(8);
    EXPECT_DEATH(
        (void)comm.all_reduce(TensorView(c.data(), DType::kF32, {4}),
                              TensorView(c.data() + 2, DType::kF32, {4}), ReduceOp::kSum, nullptr),
        "out and in overlap");
    EXPECT_DEATH((void)comm.split(-5, 0), "split: color -5");
}

}  // namespace
}  // namespace lathe
