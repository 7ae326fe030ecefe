#include "dist/rendezvous.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace lathe {
namespace {

// A port that was free a moment ago (bound to 0, read back, closed).
int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    ::close(fd);
    return ntohs(a.sin_port);
}

RendezvousOptions options(int port, int rank, int world, int timeout_ms = 20'000) {
    RendezvousOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.rank = rank;
    o.world_size = world;
    o.timeout_ms = timeout_ms;
    return o;
}

// Four ranks on threads, the others started before rank 0 (they retry until it listens): every
// one gets rank 0's bytes.
TEST(Rendezvous, RankZeroHandsItsBytesToEveryRank) {
    const int port = free_port();
    constexpr int kWorld = 4;
    std::vector<uint8_t> payload(128);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7 + 3);
    std::vector<Result<std::vector<uint8_t>>> got(kWorld, Status(StatusCode::kInternal, "unset"));
    std::vector<std::thread> threads;
    for (int r = kWorld - 1; r >= 0; --r) {
        threads.emplace_back([&, r] {
            // Non-zero ranks offer other bytes: only rank 0's count.
            const std::vector<uint8_t> mine = r == 0 ? payload : std::vector<uint8_t>(5, 9);
            got[size_t(r)] = rendezvous_broadcast(options(port, r, kWorld), mine);
        });
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
        ASSERT_TRUE(got[size_t(r)].ok()) << r << ": " << got[size_t(r)].status().to_string();
        EXPECT_EQ(*got[size_t(r)], payload) << "rank " << r;
    }
}

TEST(Rendezvous, OneProcessNeedsNoNetwork) {
    const std::vector<uint8_t> payload = {1, 2, 3};
    auto got = rendezvous_broadcast(options(0, 0, 1), payload);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, payload);
}

TEST(Rendezvous, MissingRankTimesOutSayingWhatToCheck) {
    const int port = free_port();
    auto got = rendezvous_broadcast(options(port, 0, 3, 300), std::vector<uint8_t>{1});
    ASSERT_FALSE(got.ok());
    const std::string& m = got.status().message();
    EXPECT_NE(m.find(fmt::format("rendezvous at 127.0.0.1:{}", port)), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 300 ms waiting for ranks (1 of 3 joined)"), std::string::npos)
        << m;
    EXPECT_NE(m.find("MASTER_ADDR, MASTER_PORT"), std::string::npos) << m;
}

TEST(Rendezvous, NoRankZeroTimesOutConnecting) {
    const int port = free_port();
    auto got = rendezvous_broadcast(options(port, 1, 2, 300), {});
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("timed out after 300 ms connecting to rank 0"),
              std::string::npos)
        << got.status().message();
}

TEST(Rendezvous, DisagreeingWorldSizeIsRefused) {
    const int port = free_port();
    Result<std::vector<uint8_t>> root = Status(StatusCode::kInternal, "unset");
    Result<std::vector<uint8_t>> peer = Status(StatusCode::kInternal, "unset");
    std::thread t0([&] { root = rendezvous_broadcast(options(port, 0, 2, 5000), {}); });
    std::thread t1([&] { peer = rendezvous_broadcast(options(port, 1, 3, 5000), {}); });
    t0.join();
    t1.join();
    ASSERT_FALSE(root.ok());
    EXPECT_NE(root.status().message().find("a rank announced a world of 3 processes, rank 0 has 2"),
              std::string::npos)
        << root.status().message();
    ASSERT_FALSE(peer.ok());
    EXPECT_NE(peer.status().message().find("rank 0 refused this rank"), std::string::npos)
        << peer.status().message();
}

TEST(Rendezvous, BadSettingsAreErrors) {
    auto no_port = rendezvous_broadcast(options(0, 1, 2), {});
    ASSERT_FALSE(no_port.ok());
    EXPECT_NE(no_port.status().message().find("MASTER_PORT is not set"), std::string::npos);
    RendezvousOptions o = options(29500, 1, 2);
    o.host = "";
    auto no_host = rendezvous_broadcast(o, {});
    ASSERT_FALSE(no_host.ok());
    EXPECT_NE(no_host.status().message().find("MASTER_ADDR is not set"), std::string::npos);
    auto bad_rank = rendezvous_broadcast(options(29500, 2, 2), {});
    ASSERT_FALSE(bad_rank.ok());
}

}  // namespace
}  // namespace lathe
