#include "dist/rendezvous.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace lathe {

namespace {

constexpr char kMagic[8] = {'L', 'A', 'T', 'H', 'E', 'R', 'V', '1'};
// A payload larger than this is a bug or a stranger on the port (the NCCL id is 128 bytes).
constexpr uint32_t kMaxPayload = 1 << 20;

using Clock = std::chrono::steady_clock;

// Closes a socket on scope exit.
struct Fd {
    int fd = -1;
    explicit Fd(int f = -1) : fd(f) {}
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
    Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) {
            if (fd >= 0) ::close(fd);
            fd = o.fd;
            o.fd = -1;
        }
        return *this;
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
};

int ms_left(Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left > 0 ? int(left) : 0;
}

std::string where(const RendezvousOptions& o) {
    return fmt::format("rendezvous at {}:{} (MASTER_ADDR:MASTER_PORT), rank {} of {}", o.host,
                       o.port, o.rank, o.world_size);
}

// Waits until `fd` is ready for `events` or the deadline passes.
Status wait_ready(int fd, short events, Clock::time_point deadline, const RendezvousOptions& o,
                  std::string_view doing) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int n = ::poll(&p, 1, ms_left(deadline));
        if (n > 0) return ok_status();
        if (n == 0)
            return failed_precondition_error(
                "{}: timed out after {} ms {}; check that every rank was started with the same "
                "MASTER_ADDR, MASTER_PORT and world size, and that rank 0's port is reachable",
                where(o), o.timeout_ms, doing);
        if (errno != EINTR)
            return io_error("{}: poll while {}: {}", where(o), doing, std::strerror(errno));
    }
}

Status send_all(int fd, const void* data, size_t n, Clock::time_point deadline,
                const RendezvousOptions& o) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        LATHE_RETURN_IF_ERROR(wait_ready(fd, POLLOUT, deadline, o, "sending"));
        const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return io_error("{}: send: {}", where(o), std::strerror(errno));
        }
        p += k;
        n -= size_t(k);
    }
    return ok_status();
}

Status recv_all(int fd, void* data, size_t n, Clock::time_point deadline,
                const RendezvousOptions& o, std::string_view doing) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        LATHE_RETURN_IF_ERROR(wait_ready(fd, POLLIN, deadline, o, doing));
        const ssize_t k = ::recv(fd, p, n, 0);
        if (k == 0) return io_error("{}: the peer closed the connection while {}", where(o), doing);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return io_error("{}: recv while {}: {}", where(o), doing, std::strerror(errno));
        }
        p += k;
        n -= size_t(k);
    }
    return ok_status();
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

Result<std::vector<uint8_t>> serve(const RendezvousOptions& o, std::span<const uint8_t> payload,
                                   Clock::time_point deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(o.port);
    // Listen on every interface: MASTER_ADDR names this host as the others see it.
    if (const int rc = ::getaddrinfo(nullptr, port.c_str(), &hints, &res); rc != 0)
        return io_error("{}: getaddrinfo: {}", where(o), gai_strerror(rc));
    Fd listener;
    int last_errno = 0;
    // Prefer IPv6 with dual stack (it also takes IPv4 peers), else the first that binds.
    for (int pass = 0; pass < 2 && listener.fd < 0; ++pass) {
        for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
            if ((pass == 0) != (a->ai_family == AF_INET6)) continue;
            Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
            if (s.fd < 0) {
                last_errno = errno;
                continue;
            }
            const int one = 1, zero = 0;
            ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (a->ai_family == AF_INET6)
                ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (::bind(s.fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd, 128) == 0) {
                listener = std::move(s);
                break;
            }
            last_errno = errno;
        }
    }
    ::freeaddrinfo(res);
    if (listener.fd < 0)
        return io_error("{}: rank 0 cannot listen on port {}: {}; pick a free MASTER_PORT",
                        where(o), o.port, std::strerror(last_errno));

    std::vector<Fd> peers(size_t(o.world_size));
    for (int joined = 1; joined < o.world_size;) {
        LATHE_RETURN_IF_ERROR(
            wait_ready(listener.fd, POLLIN, deadline, o,
                       fmt::format("waiting for ranks ({} of {} joined)", joined, o.world_size)));
        Fd peer(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
        if (peer.fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return io_error("{}: accept: {}", where(o), std::strerror(errno));
        }
        uint8_t hello[16];
        LATHE_RETURN_IF_ERROR(
            recv_all(peer.fd, hello, sizeof hello, deadline, o, "reading a rank's hello"));
        if (std::memcmp(hello, kMagic, sizeof kMagic) != 0)
            return failed_precondition_error(
                "{}: something that is not a lathe rank connected to port {}; pick another "
                "MASTER_PORT",
                where(o), o.port);
        const uint32_t rank = get_u32(hello + 8), world = get_u32(hello + 12);
        std::string refused;
        if (world != uint32_t(o.world_size))
            refused = fmt::format("a rank announced a world of {} processes, rank 0 has {}", world,
                                  o.world_size);
        else if (rank == 0 || rank >= world)
            refused = fmt::format("a rank announced rank {}, outside [1, {})", rank, world);
        else if (peers[rank].fd >= 0)
            refused = fmt::format("rank {} connected twice", rank);
        if (!refused.empty()) {
            std::vector<uint8_t> no(kMagic, kMagic + sizeof kMagic);
            put_u32(no, 1);
            put_u32(no, 0);
            (void)send_all(peer.fd, no.data(), no.size(), deadline, o);
            return failed_precondition_error(
                "{}: {}; two jobs on one MASTER_PORT, or launchers that disagree", where(o),
                refused);
        }
        peers[rank] = std::move(peer);
        ++joined;
    }
    std::vector<uint8_t> reply(kMagic, kMagic + sizeof kMagic);
    put_u32(reply, 0);
    put_u32(reply, uint32_t(payload.size()));
    reply.insert(reply.end(), payload.begin(), payload.end());
    for (int r = 1; r < o.world_size; ++r)
        LATHE_RETURN_IF_ERROR(
            send_all(peers[size_t(r)].fd, reply.data(), reply.size(), deadline, o));
    // Each peer closes after reading the whole reply; waiting for that keeps our close from
    // resetting a connection whose reply is still in flight.
    for (int r = 1; r < o.world_size; ++r) {
        char byte;
        if (wait_ready(peers[size_t(r)].fd, POLLIN, deadline, o, "waiting for ranks to finish")
                .ok())
            (void)::recv(peers[size_t(r)].fd, &byte, 1, 0);
    }
    return std::vector<uint8_t>(payload.begin(), payload.end());
}

Result<std::vector<uint8_t>> join(const RendezvousOptions& o, Clock::time_point deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    const std::string port = std::to_string(o.port);
    Fd s;
    std::string last_error = "no address";
    // Rank 0 may start later than this rank: retry until the deadline, every 100 ms.
    while (s.fd < 0) {
        addrinfo* res = nullptr;
        const int rc = ::getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res);
        if (rc != 0 && rc != EAI_AGAIN)
            return invalid_argument_error("{}: cannot resolve MASTER_ADDR '{}': {}", where(o),
                                          o.host, gai_strerror(rc));
        for (addrinfo* a = res; a != nullptr && s.fd < 0; a = a->ai_next) {
            Fd c(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
            if (c.fd < 0) continue;
            if (::connect(c.fd, a->ai_addr, a->ai_addrlen) == 0)
                s = std::move(c);
            else
                last_error = std::strerror(errno);
        }
        if (res != nullptr) ::freeaddrinfo(res);
        if (s.fd >= 0) break;
        if (ms_left(deadline) == 0)
            return failed_precondition_error(
                "{}: timed out after {} ms connecting to rank 0 (last error: {}); check that "
                "rank 0 runs and that MASTER_ADDR and MASTER_PORT name it",
                where(o), o.timeout_ms, last_error);
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
    }
    const int one = 1;
    ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<uint8_t> hello(kMagic, kMagic + sizeof kMagic);
    put_u32(hello, uint32_t(o.rank));
    put_u32(hello, uint32_t(o.world_size));
    LATHE_RETURN_IF_ERROR(send_all(s.fd, hello.data(), hello.size(), deadline, o));
    uint8_t head[16];
    LATHE_RETURN_IF_ERROR(
        recv_all(s.fd, head, sizeof head, deadline, o, "waiting for rank 0's reply"));
    if (std::memcmp(head, kMagic, sizeof kMagic) != 0)
        return failed_precondition_error(
            "{}: the server at the port is not lathe's rank 0; pick another MASTER_PORT", where(o));
    if (get_u32(head + 8) != 0)
        return failed_precondition_error(
            "{}: rank 0 refused this rank (another world size or a duplicate rank; its log says "
            "which)",
            where(o));
    const uint32_t n = get_u32(head + 12);
    if (n > kMaxPayload)
        return data_loss_error("{}: rank 0 announced {} bytes, more than {}", where(o), n,
                               kMaxPayload);
    std::vector<uint8_t> payload(n);
    LATHE_RETURN_IF_ERROR(
        recv_all(s.fd, payload.data(), n, deadline, o, "reading rank 0's payload"));
    return payload;
}

}  // namespace

Result<std::vector<uint8_t>> rendezvous_broadcast(const RendezvousOptions& options,
                                                  std::span<const uint8_t> payload) {
    const RendezvousOptions& o = options;
    if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
        return invalid_argument_error("rendezvous: rank {} of a world of {}", o.rank, o.world_size);
    if (o.world_size == 1) return std::vector<uint8_t>(payload.begin(), payload.end());
    if (o.port < 1 || o.port > 65535)
        return invalid_argument_error(
            "{}: MASTER_PORT is not set (or not a port): a world of {} processes without MPI "
            "hands out the NCCL id over TCP; set MASTER_ADDR and MASTER_PORT on every rank",
            where(o), o.world_size);
    if (o.rank != 0 && o.host.empty())
        return invalid_argument_error(
            "{}: MASTER_ADDR is not set; set it to rank 0's host name or address on every rank",
            where(o));
    if (payload.size() > kMaxPayload)
        return invalid_argument_error("rendezvous: a payload of {} bytes, at most {}",
                                      payload.size(), kMaxPayload);
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(o.timeout_ms);
    return o.rank == 0 ? serve(o, payload, deadline) : join(o, deadline);
}

}  // namespace lathe
