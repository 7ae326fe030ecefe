#include "dist/host_collectives.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

namespace lathe {
namespace {

// One rank: a gather gives this rank's bytes back, reductions give the value passed.
TEST(HostCollectives, LocalGatherCopiesTheBytes) {
    LocalCommunicator comm;
    const std::vector<std::byte> mine = {std::byte{7}, std::byte{0}, std::byte{255}};
    std::vector<std::byte> all(3, std::byte{0x55});
    ASSERT_TRUE(all_gather_bytes(comm, mine, all, nullptr).ok());
    EXPECT_EQ(all, mine);
    // In place: chunk 0 of all is already mine.
    ASSERT_TRUE(all_gather_bytes(comm, all, all, nullptr).ok());
    EXPECT_EQ(all, mine);
    // Nothing to move.
    std::vector<std::byte> none;
    EXPECT_TRUE(all_gather_bytes(comm, none, none, nullptr).ok());
}

TEST(HostCollectives, LocalTypedValues) {
    LocalCommunicator comm;
    const std::vector<double> mine = {1.5, -0.0, std::numeric_limits<double>::denorm_min()};
    std::vector<double> all(3, 9.0);
    ASSERT_TRUE(all_gather_values<double>(comm, mine, all, nullptr).ok());
    EXPECT_EQ(std::memcmp(all.data(), mine.data(), sizeof(double) * 3), 0);

    struct Pair {
        int64_t a;
        float b;
    };
    auto pairs = all_gather_value(comm, Pair{-3, 0.25f}, nullptr);
    ASSERT_TRUE(pairs.ok());
    ASSERT_EQ(pairs->size(), 1u);
    EXPECT_EQ((*pairs)[0].a, -3);
    EXPECT_EQ((*pairs)[0].b, 0.25f);

    EXPECT_TRUE(barrier(comm, nullptr).ok());
    auto max = all_reduce_max(comm, -17, nullptr);
    ASSERT_TRUE(max.ok());
    EXPECT_EQ(*max, -17);
    auto isum = all_reduce_sum(comm, int64_t(1) << 40, nullptr);
    ASSERT_TRUE(isum.ok());
    EXPECT_EQ(*isum, int64_t(1) << 40);
    auto dsum = all_reduce_sum(comm, 0.1, nullptr);
    ASSERT_TRUE(dsum.ok());
    EXPECT_EQ(*dsum, 0.1);
}

TEST(HostCollectivesDeathTest, WrongOutputSizeIsABug) {
    LocalCommunicator comm;
    const std::vector<std::byte> mine(4);
    std::vector<std::byte> all(5);
    EXPECT_DEATH((void)all_gather_bytes(comm, mine, all, nullptr), "5 bytes of output for 1 ranks");
}

}  // namespace
}  // namespace lathe
