#include "dist/consistency.h"

#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "core/hash.h"
#include "core/temp_files_test_util.h"
#include "dist/thread_ranks_test_util.h"

namespace lathe {
namespace {

using testutil::run_thread_ranks;

std::vector<RankItem> items_for(int rank, int differing_rank = -1) {
    std::vector<RankItem> items = {{"binary", 0x1111}, {"config", 0x2222}, {"data index", 0x3333}};
    if (rank == differing_rank) items[1].hash ^= 1;
    return items;
}

// Each rank's status, by rank.
std::vector<Status> run_check(int size, const std::function<std::vector<RankItem>(int)>& items) {
    std::vector<Status> statuses(static_cast<size_t>(size));
    run_thread_ranks(size, [&](Communicator& comm) {
        const std::vector<RankItem> mine = items(comm.rank());
        statuses[size_t(comm.rank())] = check_same_across_ranks(comm, mine, nullptr);
    });
    return statuses;
}

bool contains(const Status& s, std::string_view text) {
    return s.message().find(text) != std::string::npos;
}

TEST(Consistency, OneRankAlwaysAgrees) {
    LocalCommunicator comm;
    const std::vector<RankItem> items = items_for(0);
    EXPECT_TRUE(check_same_across_ranks(comm, items, nullptr).ok());
    EXPECT_TRUE(check_same_across_ranks(comm, {}, nullptr).ok());
}

TEST(Consistency, SameItemsOnEveryRankAgree) {
    for (const Status& s : run_check(3, [](int r) { return items_for(r); }))
        EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(Consistency, ADifferentHashNamesTheKeyAndRankOnEveryRank) {
    const std::vector<Status> statuses = run_check(3, [](int r) { return items_for(r, 2); });
    const std::string host = host_name();
    for (const Status& s : statuses) {
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
        EXPECT_TRUE(contains(s, "parallel: rank 2 on " + host +
                                    " has a different config than rank 0 on " + host +
                                    "; every rank must run the same lathe binary, configuration "
                                    "and data (config: 0x0000000000002222 on rank 0, "
                                    "0x0000000000002223 on rank 2)"))
            << s.message();
        EXPECT_FALSE(contains(s, "binary:")) << s.message();
        EXPECT_EQ(s.message(), statuses[0].message());
    }
}

TEST(Consistency, SeveralKeysAndRanksAreListedThenCounted) {
    // Ranks 1..6 differ: 1 in two keys, the others in one; the message names the first
    // kMaxRanksNamed ranks and counts the rest.
    const std::vector<Status> statuses = run_check(7, [](int r) {
        std::vector<RankItem> items = items_for(r, r == 0 ? -1 : r);
        if (r == 1) items[2].hash = 0;
        return items;
    });
    const Status& s = statuses[0];
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(contains(s, "rank 1 on")) << s.message();
    EXPECT_TRUE(contains(s, "has a different config, data index than rank 0")) << s.message();
    EXPECT_TRUE(
        contains(s, "data index: 0x0000000000003333 on rank 0, 0x0000000000000000 on rank 1"))
        << s.message();
    EXPECT_TRUE(contains(s, "; also rank 2 on")) << s.message();
    EXPECT_TRUE(contains(s, "rank 4 on")) << s.message();
    EXPECT_FALSE(contains(s, "rank 5 on")) << s.message();
    EXPECT_TRUE(contains(s, " and 2 more ranks")) << s.message();
}

TEST(Consistency, ADifferentKeyListIsAMismatch) {
    // Rank 1 checks one key fewer; rank 2 the same count under another name.
    const std::vector<Status> statuses = run_check(3, [](int r) {
        std::vector<RankItem> items = items_for(r);
        if (r == 1) items.pop_back();
        if (r == 2) items[0].key = "binaries";
        return items;
    });
    for (const Status& s : statuses) {
        ASSERT_FALSE(s.ok());
        EXPECT_TRUE(contains(s, "parallel: rank 1 on")) << s.message();
        EXPECT_TRUE(contains(s, "checks other keys (2) than rank 0 on")) << s.message();
        EXPECT_TRUE(contains(s, "(3); every rank must run the same lathe binary")) << s.message();
        EXPECT_TRUE(contains(s, "; also rank 2 on")) << s.message();
    }
}

TEST(Consistency, KeyBoundariesCount) {
    // "ab" + "c" and "a" + "bc" are different key lists.
    const std::vector<Status> statuses = run_check(2, [](int r) {
        return r == 0 ? std::vector<RankItem>{{"ab", 1}, {"c", 2}}
                      : std::vector<RankItem>{{"a", 1}, {"bc", 2}};
    });
    EXPECT_FALSE(statuses[0].ok());
    EXPECT_TRUE(contains(statuses[0], "checks other keys (2)")) << statuses[0].message();
}

TEST(Consistency, HostNameIsSomething) {
    const std::string h = host_name();
    EXPECT_FALSE(h.empty());
}

TEST(FileContentHash, IsHashBytesOfTheContent) {
    testutil::TempFiles tmp("lathe_consistency");
    const std::string content = "0123456789abcdefghij\n\0tail";
    const std::string a = tmp.write("a.bin", content);
    const std::string b = tmp.write("b.bin", content + "x");
    const std::string empty = tmp.write("empty.bin", "");
    auto ha = file_content_hash(a);
    ASSERT_TRUE(ha.ok()) << ha.status().to_string();
    EXPECT_EQ(*ha, hash_bytes(content));
    auto hb = file_content_hash(b);
    ASSERT_TRUE(hb.ok());
    EXPECT_NE(*hb, *ha);
    auto he = file_content_hash(empty);
    ASSERT_TRUE(he.ok()) << he.status().to_string();
    EXPECT_EQ(*he, hash_bytes(std::string_view()));
    // The running binary, as the trainer hashes it.
    auto self = file_content_hash("/proc/self/exe");
    ASSERT_TRUE(self.ok()) << self.status().to_string();
}

TEST(FileContentHash, ErrorsNameThePath) {
    testutil::TempFiles tmp("lathe_consistency_errors");
    const std::string missing = tmp.path("missing.bin");
    auto m = file_content_hash(missing);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
    EXPECT_NE(m.status().message().find(missing), std::string::npos);
    const std::string dir = tmp.path("");
    auto d = file_content_hash(dir);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace lathe
