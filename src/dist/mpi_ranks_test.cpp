// dist_mpi_tests: run by CTest as `mpirun -np 2 --oversubscribe dist_mpi_tests` (any number of
// ranks works). Every collective of MpiCommunicator against the same math done in one process:
// each rank makes every rank's input (a function of rank and index), so it knows the answer.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "dist/consistency.h"
#include "dist/host_collectives.h"
#include "dist/mpi_communicator.h"
#include "dist/open.h"
#include "dist/process_group.h"
#include "dist/watchdog.h"

namespace lathe {
namespace {

// The world, opened once (MPI is initialized once per process) and kept for every test.
Communicator& world() {
    static std::unique_ptr<Communicator> comm = [] {
        auto group = process_group_from_env(process_environment());
        LATHE_CHECK(group.ok(), "{}", group.status().to_string());
        auto c = communicator_open(*group, Backend::kCpu, 0);
        LATHE_CHECK(c.ok(), "{}", c.status().to_string());
        return std::move(*c);
    }();
    return *comm;
}

// Rank r's input element i: distinct per rank, signs mixed, not exactly representable sums.
float input(int rank, int64_t i) {
    return std::sin(0.37f * float(i) + 1.3f * float(rank)) * float(1 + (i + rank) % 5);
}

// Rank `rank`'s n inputs in `dtype`, stored as f32 or bf16 bytes.
std::vector<uint8_t> inputs(int rank, int64_t n, DType dtype) {
    std::vector<uint8_t> bytes(size_t(n) * dtype_size(dtype));
    for (int64_t i = 0; i < n; ++i) {
        if (dtype == DType::kF32)
            reinterpret_cast<float*>(bytes.data())[i] = input(rank, i);
        else
            reinterpret_cast<bf16*>(bytes.data())[i] = float_to_bf16(input(rank, i));
    }
    return bytes;
}

float value(const std::vector<uint8_t>& bytes, DType dtype, int64_t i) {
    return dtype == DType::kF32 ? reinterpret_cast<const float*>(bytes.data())[i]
                                : bf16_to_float(reinterpret_cast<const bf16*>(bytes.data())[i]);
}

TensorView view(std::vector<uint8_t>& bytes, DType dtype) {
    return TensorView(bytes.data(), dtype, {int64_t(bytes.size() / dtype_size(dtype))});
}

// The reduction of element i over every rank's (stored) input, in double, with its bound: each of
// the size - 1 additions rounds once in the storage type (unit u of f32 or bf16) over partial sums
// bounded by the sum of |x|, and avg's division rounds once more: |got - exact| <= u * (size - 1)
// * sum|x| (+ u * |exact| for avg). max picks one of the inputs: exact.
struct Expected {
    double exact;
    double bound;
};

Expected expected(ReduceOp op, DType dtype, int64_t i, int size) {
    const double u = dtype == DType::kF32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
    double sum = 0, sum_abs = 0, max = -INFINITY;
    for (int r = 0; r < size; ++r) {
        const float f = input(r, i);
        const double x = dtype == DType::kF32 ? f : bf16_to_float(float_to_bf16(f));
        sum += x;
        sum_abs += std::fabs(x);
        max = std::max(max, x);
    }
    switch (op) {
        case ReduceOp::kSum:
            return {sum, u * (size - 1) * sum_abs};
        case ReduceOp::kAvg:
            return {sum / size, u * (size - 1) * sum_abs / size + u * std::fabs(sum / size)};
        case ReduceOp::kMax:
            return {max, 0.0};
    }
    return {0, 0};
}

constexpr DType kDtypes[] = {DType::kF32, DType::kBF16};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

TEST(MpiRanks, WorldAgreesWithTheLauncher) {
    auto group = process_group_from_env(process_environment());
    ASSERT_TRUE(group.ok());
    EXPECT_EQ(group->launcher, Launcher::kMpirun);
    EXPECT_EQ(world().backend(), "mpi");
    EXPECT_EQ(world().size(), group->world_size);
    EXPECT_EQ(world().rank(), group->rank);
    EXPECT_GE(world().size(), 2) << "run under mpirun -np 2";
    EXPECT_FALSE(world().accepts(Device::kCuda));
}

TEST(MpiRanks, AllReduce) {
    Communicator& c = world();
    constexpr int64_t n = 1000;
    for (DType dtype : kDtypes)
        for (ReduceOp op : kOps)
            for (bool in_place : {false, true}) {
                std::vector<uint8_t> in = inputs(c.rank(), n, dtype);
                std::vector<uint8_t> out(in.size(), 0xFF);
                std::vector<uint8_t>& dst = in_place ? in : out;
                ASSERT_TRUE(c.all_reduce(view(dst, dtype), view(in, dtype), op, nullptr).ok());
                for (int64_t i = 0; i < n; ++i) {
                    const Expected e = expected(op, dtype, i, c.size());
                    ASSERT_LE(std::fabs(value(dst, dtype, i) - e.exact), e.bound)
                        << dtype_name(dtype) << " " << reduce_op_name(op) << " in place "
                        << in_place << " element " << i;
                }
            }
}

TEST(MpiRanks, ReduceScatter) {
    Communicator& c = world();
    constexpr int64_t chunk = 333;
    const int64_t n = chunk * c.size();
    for (DType dtype : kDtypes)
        for (ReduceOp op : kOps)
            for (bool in_place : {false, true}) {
                std::vector<uint8_t> in = inputs(c.rank(), n, dtype);
                std::vector<uint8_t> out(size_t(chunk) * dtype_size(dtype), 0xFF);
                // In place: out is chunk rank() of in.
                TensorView dst =
                    in_place ? view(in, dtype).slice(c.rank() * chunk, (c.rank() + 1) * chunk)
                             : view(out, dtype);
                ASSERT_TRUE(c.reduce_scatter(dst, view(in, dtype), op, nullptr).ok());
                for (int64_t j = 0; j < chunk; ++j) {
                    const int64_t i = c.rank() * chunk + j;
                    const Expected e = expected(op, dtype, i, c.size());
                    const float got = dtype == DType::kF32 ? dst.as<float>()[j]
                                                           : bf16_to_float(dst.as<bf16>()[j]);
                    ASSERT_LE(std::fabs(got - e.exact), e.bound)
                        << dtype_name(dtype) << " " << reduce_op_name(op) << " in place "
                        << in_place << " element " << i;
                }
            }
}

TEST(MpiRanks, AllGatherAndBroadcastMoveExactBytes) {
    Communicator& c = world();
    constexpr int64_t chunk = 17;
    for (bool in_place : {false, true}) {
        std::vector<int32_t> out(size_t(chunk * c.size()), -1);
        std::vector<int32_t> mine(chunk);
        for (int64_t j = 0; j < chunk; ++j) mine[size_t(j)] = int32_t(1000 * c.rank() + j);
        TensorView all(out.data(), DType::kI32, {int64_t(out.size())});
        ConstTensorView in = TensorView(mine.data(), DType::kI32, {chunk});
        if (in_place) {
            std::copy(mine.begin(), mine.end(), out.begin() + c.rank() * chunk);
            in = all.slice(c.rank() * chunk, (c.rank() + 1) * chunk);
        }
        ASSERT_TRUE(c.all_gather(all, in, nullptr).ok());
        for (int r = 0; r < c.size(); ++r)
            for (int64_t j = 0; j < chunk; ++j)
                ASSERT_EQ(out[size_t(r * chunk + j)], 1000 * r + j) << "in place " << in_place;
    }
    const int root = c.size() - 1;
    std::vector<uint8_t> buf = inputs(c.rank(), 64, DType::kBF16);
    ASSERT_TRUE(c.broadcast(view(buf, DType::kBF16), root, nullptr).ok());
    EXPECT_EQ(buf, inputs(root, 64, DType::kBF16));
}

TEST(MpiRanks, SplitMakesGroups) {
    Communicator& c = world();
    // Everyone in one group, ranked backwards by key.
    auto all = c.split(0, c.size() - c.rank());
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    ASSERT_NE(all->get(), nullptr);
    EXPECT_EQ((*all)->size(), c.size());
    EXPECT_EQ((*all)->rank(), c.size() - 1 - c.rank());
    // Groups by parity; a reduction inside one sums only its members.
    auto parity = c.split(c.rank() % 2, c.rank());
    ASSERT_TRUE(parity.ok());
    Communicator& g = **parity;
    EXPECT_EQ(g.size(), (c.size() - c.rank() % 2 + 1) / 2);
    EXPECT_EQ(g.rank(), c.rank() / 2);
    std::vector<float> one = {float(c.rank())}, sum = {0};
    ASSERT_TRUE(g.all_reduce(TensorView(sum.data(), DType::kF32, {1}),
                             TensorView(one.data(), DType::kF32, {1}), ReduceOp::kSum, nullptr)
                    .ok());
    float want = 0;
    for (int r = c.rank() % 2; r < c.size(); r += 2) want += float(r);
    EXPECT_EQ(sum[0], want);
    // Rank 0 joins no group.
    auto some = c.split(c.rank() == 0 ? Communicator::kNoColor : 1, 0);
    ASSERT_TRUE(some.ok());
    EXPECT_EQ(some->get() == nullptr, c.rank() == 0);
    if (c.rank() != 0) {
        EXPECT_EQ((*some)->size(), c.size() - 1);
    }
}

TEST(MpiRanks, HostCollectives) {
    Communicator& c = world();
    // An odd size, so no chunk is aligned to anything.
    constexpr size_t n = 13;
    std::vector<std::byte> mine(n), all(n * size_t(c.size()), std::byte{0});
    for (size_t i = 0; i < n; ++i) mine[i] = std::byte(uint8_t(31 * c.rank() + i));
    ASSERT_TRUE(all_gather_bytes(c, mine, all, nullptr).ok());
    for (int r = 0; r < c.size(); ++r)
        for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(all[size_t(r) * n + i], std::byte(uint8_t(31 * r + i))) << r << " " << i;

    auto doubles = all_gather_value(c, 0.5 + c.rank(), nullptr);
    ASSERT_TRUE(doubles.ok());
    for (int r = 0; r < c.size(); ++r) EXPECT_EQ((*doubles)[size_t(r)], 0.5 + r);

    ASSERT_TRUE(barrier(c, nullptr).ok());
    // The largest value sits on the last rank, then on rank 0.
    auto max = all_reduce_max(c, c.rank() == c.size() - 1 ? 7 : -c.rank(), nullptr);
    ASSERT_TRUE(max.ok());
    EXPECT_EQ(*max, 7);
    max = all_reduce_max(c, c.rank() == 0 ? 1 : 0, nullptr);
    ASSERT_TRUE(max.ok());
    EXPECT_EQ(*max, 1);
    // Sums: exact for integers beyond 2^53; doubles added in rank order give the same bits on
    // every rank as that order on one process.
    auto isum = all_reduce_sum(c, (int64_t(1) << 55) + c.rank(), nullptr);
    ASSERT_TRUE(isum.ok());
    EXPECT_EQ(*isum, int64_t(c.size()) * (int64_t(1) << 55) + c.size() * (c.size() - 1) / 2);
    auto dsum = all_reduce_sum(c, 0.1 * (c.rank() + 1), nullptr);
    ASSERT_TRUE(dsum.ok());
    double want = 0;
    for (int r = 0; r < c.size(); ++r) want += 0.1 * (r + 1);
    EXPECT_EQ(*dsum, want);
}

TEST(MpiRanks, ConsistencyCheck) {
    Communicator& c = world();
    std::vector<RankItem> items = {{"binary", 11}, {"config", 22}, {"data index", 33}};
    const Status same = check_same_across_ranks(c, items, nullptr);
    EXPECT_TRUE(same.ok()) << same.to_string();

    // Rank 1 runs another data index: every rank refuses, naming rank 1, its host and the key.
    if (c.rank() == 1) items[2].hash = 34;
    const Status differs = check_same_across_ranks(c, items, nullptr);
    ASSERT_FALSE(differs.ok());
    const std::string want =
        "parallel: rank 1 on " + host_name() + " has a different data index than rank 0 on ";
    EXPECT_NE(differs.message().find(want), std::string::npos) << differs.message();
    EXPECT_EQ(differs.message().find("config:"), std::string::npos) << differs.message();
    items[2].hash = 33;

    // The last rank checks one key more.
    if (c.rank() == c.size() - 1) items.push_back({"tokenizer", 44});
    const Status keys = check_same_across_ranks(c, items, nullptr);
    ASSERT_FALSE(keys.ok());
    EXPECT_NE(keys.message().find(fmt::format("rank {} on", c.size() - 1)), std::string::npos)
        << keys.message();
    EXPECT_NE(keys.message().find("checks other keys (4) than rank 0 on"), std::string::npos)
        << keys.message();
}

// Rank 0 waits at a barrier that rank 1 never reaches; rank 0's watchdog must end the job. Run by
// tests/test_watchdog_mpi.py (it ends the job, so it is skipped in the ordinary run), which
// checks the message, mpirun's exit status and the time taken.
TEST(MpiWatchdog, EndsABarrierARankNeverReaches) {
    const char* timeout_ms = std::getenv("LATHE_TEST_WATCHDOG_MS");
    if (timeout_ms == nullptr) GTEST_SKIP() << "run by tests/test_watchdog_mpi.py (ends the job)";
    Communicator& c = world();
    Watchdog watchdog(&c, std::chrono::milliseconds(std::atoi(timeout_ms)), rank_description(c));
    if (c.rank() == 1) {
        // Never joins: the others wait for it.
        std::this_thread::sleep_for(std::chrono::minutes(5));
    } else {
        auto guard = watchdog.arm("barrier of the watchdog test");
        (void)barrier(c, nullptr);
    }
    ADD_FAILURE() << "the watchdog did not end the job";
}

}  // namespace
}  // namespace lathe
