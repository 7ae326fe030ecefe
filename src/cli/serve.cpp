// `lathe serve`: an OpenAI-compatible HTTP server over the continuous-batching scheduler
// (src/infer/scheduler.h). docs/INFERENCE.md has the endpoints and fields.
//
//   lathe serve --checkpoint DIR [--host 127.0.0.1] [--port 8000] [--device auto|cpu|cuda]
//       [--api-key KEY] [--max-seqs N] [--max-queue N] [--max-len N] [--prefill-chunk N]
//       [--model-name NAME] [--kv-block-size 16] [--kv-blocks N] [--cuda-graphs 1]
//       [--tensor-parallel T] [--random-weights SEED] [--request-read-timeout-s 30]
//
// Threads: the HTTP library's pool parses requests, submits their sequences to the scheduler
// and waits on (or streams from) their tickets; the scheduler's one engine thread owns the model;
// one more thread waits for SIGINT/SIGTERM and stops the server. A pool thread serves one
// connection at a time, and each request must arrive whole within --request-read-timeout-s, so
// that slow clients cannot hold the pool (DeadlineServer). Every error a request can cause
// is answered with an OpenAI error object ({"error": {"message", "type", "param", "code"}}) and a
// 4xx (503 with Retry-After when the queue is full); the server keeps serving.
//
// --tensor-parallel T (one process per GPU: `lathe launch --gpus T lathe serve ...`, or mpirun on
// the CPU): each process holds a shard (infer/tensor_parallel.h). Rank 0 alone listens and
// schedules, its main thread running the scheduler's steps (MPI is called from one thread); its
// engine sends every call to the other ranks, which replay it (InferenceEngine::lead/follow)
// until rank 0 stops and releases them.
#ifdef LATHE_HAVE_HTTPLIB
#include <httplib.h>
#endif

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "core/log.h"
#include "infer/engine.h"
#include "infer/prompting.h"
#include "infer/scheduler.h"
#include "infer/tensor_parallel.h"
#include "io/json.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "run/inference_processes.h"
#include "run/world.h"

namespace lathe {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct ServeRequest {
    std::string checkpoint, host = "127.0.0.1", device = "auto", api_key, model_name;
    int port = 8000;
    int64_t max_seqs = 8, max_queue = 64, max_len = 0;
    int64_t kv_block_size = -1, kv_blocks = 0;  // -1: 16 (paged), or rows (run_serve)
    std::string decode_gemv = "auto";
    int64_t prefill_chunk = 0;  // 0: 2048 on CUDA, 256 on the CPU
    int64_t max_body_bytes = int64_t(16) << 20;
    // A chat request without max_tokens generates at most this many (and the remaining context):
    // a non-streaming client that leaves is not noticed until its sequences end.
    int64_t default_max_tokens = 1024;
    bool kv_block_size_given = false;
    bool cuda_graphs = true;           // the paged CUDA decode step replayed from CUDA graphs
    std::string peer_reduce = "auto";  // tensor parallel: small sums over peer GPU memory
    int tensor_parallel = 1;
    int64_t random_weights = -1;          // < 0: load the checkpoint's safetensors
    int64_t request_read_timeout_s = 30;  // a request's headers and body arrive within this
};

#ifdef LATHE_HAVE_HTTPLIB

// Slow clients. A pool thread serves one connection from the moment the pool takes it until it
// closes, and the library's read timeout bounds one recv, not a request: a client that sends its
// request a byte every few seconds holds its thread for as long as it likes, and as many such
// clients as the pool has threads leave every other client unanswered.
//
// So each request must arrive whole (request line, headers and body) within
// --request-read-timeout-s of the moment the server began to wait for it: its connection's
// accept for the first request, the end of the previous response for the next ones. The deadline
// lives in the connection's stream (DeadlineStream): a read that would have to wait past it
// fails, the request is answered 408 (when its request line came in) and the connection closes.
// Bytes that have arrived are still read after the deadline, so that a connection that waited in
// the pool's queue beyond its deadline is served when its whole request is there. Responses never
// read from the socket: a stream, however long, is never cut.
//
// This bounds every client's wait, whatever the number of slow connections: the pool takes
// connections first in, first out, and each connection accepted before a given one has a
// deadline no later than its own; by then each has given its thread back, or gives it back as
// soon as the pool takes it; and a connection whose response ends while others wait is closed
// rather than kept alive, so that no connection takes a second deadline ahead of them. A cap on
// connections per address or in all would add no bound, and would refuse benchmarks that open
// hundreds of connections from one host: there is none.
//
// The hooks of cpp-httplib 0.11: its listen loop queues each accepted socket on the pool
// (StampingPool stamps the job there with the time), whose thread hands it to
// Server::process_and_close_socket, a private virtual that DeadlineServer overrides with its own
// keep-alive loop over a DeadlineStream, calling the library's process_request for each request.
// (set_socket_options sees the listening socket only; the pre-routing handler runs before the
// body is read.) The accept time and the stream of the connection a thread serves reach the
// library's callbacks on that thread through thread_locals, as the library passes no context.
using SteadyClock = std::chrono::steady_clock;

// When the listen loop queued the connection this pool thread serves (StampingPool sets it).
SteadyClock::time_point& connection_accepted_at() {
    thread_local SteadyClock::time_point t;
    return t;
}

// The library's thread pool, each job stamped with the time the listen loop queued it (right
// after the accept of its connection); `waiting` counts the connections queued and not yet taken
// by a thread.
class StampingPool final : public httplib::TaskQueue {
public:
    StampingPool(size_t threads, std::shared_ptr<std::atomic<int64_t>> waiting)
        : pool_(threads), waiting_(std::move(waiting)) {}
    void enqueue(std::function<void()> fn) override {
        waiting_->fetch_add(1);
        pool_.enqueue([fn = std::move(fn), queued = SteadyClock::now(), waiting = waiting_] {
            waiting->fetch_sub(1);
            connection_accepted_at() = queued;
            fn();
        });
    }
    void shutdown() override { pool_.shutdown(); }

private:
    httplib::ThreadPool pool_;
    std::shared_ptr<std::atomic<int64_t>> waiting_;
};

// One connection's socket as the library's Stream: reads go through a buffer kept across the
// connection's requests, and fail once a read would have to wait past the deadline of the
// request being read (set_deadline). The read and write timeouts bound each wait, as the
// library's own stream does.
class DeadlineStream final : public httplib::Stream {
public:
    // `listening`: the server's listening socket, INVALID_SOCKET once the server stops, when a
    // read still waiting gives up (so that a stop waits for no request's deadline).
    DeadlineStream(socket_t sock, std::chrono::microseconds read_timeout,
                   std::chrono::microseconds write_timeout, const std::atomic<socket_t>* listening)
        : sock_(sock),
          read_timeout_(read_timeout),
          write_timeout_(write_timeout),
          listening_(listening) {}

    // The next request: its deadline, and its head not yet read.
    void set_deadline(SteadyClock::time_point deadline) {
        deadline_ = deadline;
        expired_ = false;
        head_bytes_ = 0;
        head_state_ = 0;
        head_done_ = head_too_large_ = false;
    }
    // Whether a read failed at the deadline: the request did not arrive in time.
    bool expired() const { return expired_; }
    // Whether a read failed because the request's head (request line and headers) ran past
    // kMaxHeadBytes.
    bool head_too_large() const { return head_too_large_; }
    // The library bounds neither the number of header lines nor their bytes, and a client that
    // sends headers without end at full speed never waits, so its deadline never fires: the head
    // of a request may take this many bytes (nginx's default allows 32 KiB of large headers).
    static constexpr size_t kMaxHeadBytes = size_t(64) << 10;
    // Waits for the next request's first byte (or the peer's close) at most `idle`, and not past
    // the deadline: false when nothing came.
    bool wait_for_request(std::chrono::microseconds idle) const {
        return begin_ < end_ || poll_read(std::min(idle, until_deadline())) > 0;
    }

    bool is_readable() const override {
        return begin_ < end_ || poll_read(std::min(read_timeout_, until_deadline())) > 0;
    }
    bool is_writable() const override;
    ssize_t read(char* ptr, size_t size) override;
    ssize_t write(const char* ptr, size_t size) override;
    void get_remote_ip_and_port(std::string& ip, int& port) const override {
        address_of(true, ip, port);
    }
    void get_local_ip_and_port(std::string& ip, int& port) const override {
        address_of(false, ip, port);
    }
    socket_t socket() const override { return sock_; }

private:
    std::chrono::microseconds until_deadline() const {
        const auto left = deadline_ - SteadyClock::now();
        return left.count() > 0 ? std::chrono::ceil<std::chrono::microseconds>(left)
                                : std::chrono::microseconds(0);
    }
    // poll(2) for `events` within `timeout` (rounded up to milliseconds): > 0 ready, 0 timed out,
    // < 0 an error.
    int poll_for(short events, std::chrono::microseconds timeout) const;
    // poll_for(POLLIN, timeout) in slices of at most 100 ms, -1 once the server has stopped.
    int poll_read(std::chrono::microseconds timeout) const;
    // The numeric address and port of the peer's end (peer) or this one's; unchanged if unknown.
    void address_of(bool peer, std::string& ip, int& port) const;

    static constexpr size_t kBufferBytes = 16384;
    socket_t sock_;
    std::chrono::microseconds read_timeout_, write_timeout_;
    const std::atomic<socket_t>* listening_;
    SteadyClock::time_point deadline_ = SteadyClock::time_point::max();
    bool expired_ = false;
    // The head of the request being read: its bytes so far, and where its end (an empty line,
    // "\r\n" or "\n") stands: 0 in a line, 1 after a line's '\n', 2 after "\n\r".
    size_t head_bytes_ = 0;
    int head_state_ = 0;
    bool head_done_ = false, head_too_large_ = false;
    std::array<char, kBufferBytes> buffer_;
    size_t begin_ = 0, end_ = 0;  // buffer_[begin_, end_): received and unread
};

int DeadlineStream::poll_for(short events, std::chrono::microseconds timeout) const {
    pollfd p{sock_, events, 0};
    const int64_t ms = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
    const int wait_ms = int(std::min<int64_t>(ms, INT_MAX));
    int ready;
    do ready = ::poll(&p, 1, wait_ms);
    while (ready < 0 && errno == EINTR);
    return ready;
}

int DeadlineStream::poll_read(std::chrono::microseconds timeout) const {
    constexpr std::chrono::microseconds kSlice(100'000);
    for (;;) {
        const std::chrono::microseconds slice = std::min(timeout, kSlice);
        const int ready = poll_for(POLLIN, slice);
        if (ready != 0) return ready;
        if (listening_->load() == INVALID_SOCKET) return -1;
        timeout -= slice;
        if (timeout.count() <= 0) return 0;
    }
}

ssize_t DeadlineStream::read(char* ptr, size_t size) {
    if (begin_ == end_) {
        const std::chrono::microseconds left = until_deadline();
        const int ready = poll_read(std::min(read_timeout_, left));
        if (ready <= 0) {
            expired_ = ready == 0 && left <= read_timeout_;
            return -1;
        }
        ssize_t n;
        do n = ::recv(sock_, buffer_.data(), buffer_.size(), 0);
        while (n < 0 && errno == EINTR);
        if (n <= 0) return n;
        begin_ = 0;
        end_ = size_t(n);
    }
    const size_t n = std::min(size, end_ - begin_);
    if (!head_done_) {
        for (size_t i = 0; i < n && !head_done_; ++i) {
            const char c = buffer_[begin_ + i];
            if (c == '\n') {
                head_done_ = head_state_ != 0;
                head_state_ = 1;
            } else {
                head_state_ = c == '\r' && head_state_ == 1 ? 2 : 0;
            }
        }
        head_bytes_ += n;
        if (!head_done_ && head_bytes_ > kMaxHeadBytes) {
            head_too_large_ = true;
            return -1;
        }
    }
    std::memcpy(ptr, buffer_.data() + begin_, n);
    begin_ += n;
    return ssize_t(n);
}

// Writable within the write timeout, and not closed by the peer: a response never reads, so its
// writes are where a stream learns that its client left.
bool DeadlineStream::is_writable() const {
    if (poll_for(POLLOUT, write_timeout_) <= 0) return false;
    if (poll_for(POLLIN, std::chrono::microseconds(0)) == 0) return true;
    char byte;
    return ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

ssize_t DeadlineStream::write(const char* ptr, size_t size) {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
}

void DeadlineStream::address_of(bool peer, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    sockaddr* a = reinterpret_cast<sockaddr*>(&addr);
    if ((peer ? ::getpeername(sock_, a, &len) : ::getsockname(sock_, a, &len)) != 0) return;
    char host[NI_MAXHOST], service[NI_MAXSERV];
    if (::getnameinfo(a, len, host, sizeof(host), service, sizeof(service),
                      NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return;
    ip = host;
    port = std::atoi(service);
}

// The library's server, its connections served through DeadlineStreams (above) by a pool of
// `threads`.
class DeadlineServer final : public httplib::Server {
public:
    DeadlineServer(size_t threads, std::chrono::seconds request_read_timeout)
        : request_read_timeout_(request_read_timeout) {
        new_task_queue = [threads, waiting = waiting_] {
            return new StampingPool(threads, waiting);
        };
    }
    // Whether the request this thread reads missed its deadline (the error handler answers 408).
    static bool request_expired() {
        const DeadlineStream* s = current_stream();
        return s != nullptr && s->expired();
    }
    // Whether its head ran past DeadlineStream::kMaxHeadBytes (the error handler answers 431).
    static bool request_head_too_large() {
        const DeadlineStream* s = current_stream();
        return s != nullptr && s->head_too_large();
    }

private:
    static const DeadlineStream*& current_stream() {
        thread_local const DeadlineStream* stream = nullptr;
        return stream;
    }
    bool process_and_close_socket(socket_t sock) override;

    std::chrono::seconds request_read_timeout_;
    // Connections accepted and waiting for a pool thread (StampingPool).
    std::shared_ptr<std::atomic<int64_t>> waiting_ = std::make_shared<std::atomic<int64_t>>(0);
};

// The library's keep-alive loop, over one DeadlineStream: at most keep_alive_max_count_
// requests (the last answered with Connection: close), each after at most
// keep_alive_timeout_sec_ idle, until the server stops (svr_sock_ closed). A request that missed
// its deadline ends the connection, and so does a response while other connections wait for a
// thread (answered with Connection: close): a client that sends each request just inside its
// deadline holds its thread for one deadline, not one per request.
bool DeadlineServer::process_and_close_socket(socket_t sock) {
    using std::chrono::microseconds, std::chrono::seconds;
    DeadlineStream stream(sock, seconds(read_timeout_sec_) + microseconds(read_timeout_usec_),
                          seconds(write_timeout_sec_) + microseconds(write_timeout_usec_),
                          &svr_sock_);
    stream.set_deadline(connection_accepted_at() + request_read_timeout_);
    current_stream() = &stream;
    bool ok = false;
    for (size_t i = 0; i < keep_alive_max_count_ && svr_sock_ != INVALID_SOCKET; ++i) {
        if (!stream.wait_for_request(seconds(keep_alive_timeout_sec_))) break;
        bool closed = false;
        const bool last = i + 1 == keep_alive_max_count_ || waiting_->load() > 0;
        ok = process_request(stream, last, closed, nullptr);
        if (!ok || closed || last || stream.expired() || stream.head_too_large()) break;
        stream.set_deadline(SteadyClock::now() + request_read_timeout_);
    }
    current_stream() = nullptr;
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
}

// An OpenAI-style error: the HTTP status and the error object's fields.
struct ApiError {
    int http = 400;
    std::string message, type = "invalid_request_error", param, code;
};

std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Request bodies nest arrays and objects at most this deep; deeper bodies are refused before they
// are parsed (the DOM and its serialization recurse per level).
constexpr int64_t kMaxJsonDepth = 32;
// 'stop': at most 4 strings (OpenAI's limit) of at most 256 bytes each.
constexpr size_t kMaxStops = 4, kMaxStopBytes = 256;

// A user's value in an error message: scalars as written (strings cut to 64 bytes), arrays and
// objects by their type and size, never their whole text.
std::string describe(const json& x) {
    if (x.is_array()) return fmt::format("an array of {} items", x.size());
    if (x.is_object()) return fmt::format("an object of {} keys", x.size());
    if (x.is_string()) {
        const std::string& s = x.get_ref<const std::string&>();
        if (s.size() <= 64) return dump(x);
        size_t cut = 64;
        while (cut > 0 && (uint8_t(s[cut]) & 0xC0) == 0x80) --cut;  // whole characters
        return dump(json(s.substr(0, cut))) + fmt::format(" (cut; {} bytes)", s.size());
    }
    return dump(x);
}

void send_error(httplib::Response& res, const ApiError& e) {
    json err;
    err["message"] = e.message;
    err["type"] = e.type;
    err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
    err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
    res.status = e.http;
    if (e.http == 503) res.set_header("Retry-After", "1");
    res.set_content(dump(json{{"error", err}}), "application/json");
}

ApiError bad(std::string param, std::string message) {
    ApiError e;
    e.param = std::move(param);
    e.message = std::move(message);
    return e;
}

// The scheduler's refusal as an API error: invalid input 400, a full queue or shutdown 503.
ApiError from_status(const Status& s, const std::string& param) {
    ApiError e;
    e.message = s.message();
    if (s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kCancelled) {
        e.http = 503;
        e.type = "server_error";
        e.code = "overloaded";
    } else if (s.code() == StatusCode::kInvalidArgument) {
        e.param = param;
        if (s.message().find("context") != std::string::npos) e.code = "context_length_exceeded";
    } else {
        e.http = 500;
        e.type = "server_error";
    }
    return e;
}

// A sequence's error while it ran: a shutdown (cancelled) is 503 and may be retried elsewhere;
// anything else is the server's fault (500), never "overloaded".
ApiError from_run_error(const Status& s) {
    ApiError e;
    e.message = s.message();
    e.type = "server_error";
    e.http = s.code() == StatusCode::kCancelled ? 503 : 500;
    return e;
}

// Prometheus counters and histograms: the HTTP requests, the scheduler's (SchedulerStats).
class Metrics {
public:
    void count(const std::string& path, int code) {
        std::lock_guard<std::mutex> lock(mu_);
        ++requests_[{path, code}];
    }
    void latency(double seconds) {
        std::lock_guard<std::mutex> lock(mu_);
        latency_.observe(seconds);
    }
    std::string text(const SchedulerStats& s) const {
        std::lock_guard<std::mutex> lock(mu_);
        std::string o;
        o += "# HELP lathe_requests_total HTTP requests answered, by path and status code.\n";
        o += "# TYPE lathe_requests_total counter\n";
        for (const auto& [key, n] : requests_) {
            o += fmt::format("lathe_requests_total{{path=\"{}\",code=\"{}\"}} {}\n", key.first,
                             key.second, n);
        }
        auto one = [&](const char* name, const char* type, const char* help, int64_t v) {
            o +=
                fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
        };
        one("lathe_prompt_tokens_total", "counter", "Prompt tokens prefilled.", s.prompt_tokens);
        one("lathe_generation_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
        one("lathe_sequences_finished_total", "counter", "Sequences that left the batch.",
            s.sequences_finished);
        one("lathe_decode_steps_total", "counter", "Decode steps of the running batch.",
            s.decode_steps);
        one("lathe_decode_rows_total", "counter",
            "Sequence rows decoded (a step of n running sequences counts n).", s.decode_rows);
        one("lathe_prefill_calls_total", "counter",
            "Prefill calls to the engine (sequences admitted together and prefilled in one "
            "forward count once).",
            s.prefill_calls);
        auto seconds = [&](const char* name, const char* help, double v) {
            o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {:.6f}\n", name, help, name, name,
                             v);
        };
        seconds("lathe_prefill_seconds_total",
                "Wall time in prompt prefills, to the first token's logits on the host.",
                s.prefill_seconds);
        seconds("lathe_decode_seconds_total",
                "Wall time in decode steps, to their logits on the host.", s.decode_seconds);
        seconds("lathe_engine_step_seconds_total",
                "Wall time of the engine thread's steps: prefills, decode steps and the host work "
                "around them.",
                s.step_seconds);
        one("lathe_queue_depth", "gauge", "Sequences waiting to join the batch.", s.waiting);
        one("lathe_running_sequences", "gauge", "Sequences in the running batch.", s.running);
        auto histogram = [&](const char* name, const char* help, const SecondsHistogram& h) {
            o += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
            for (size_t i = 0; i < h.kBounds.size(); ++i)
                o += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, h.kBounds[i], h.at_most[i]);
            o += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, h.count,
                             name, h.sum, name, h.count);
        };
        histogram("lathe_request_latency_seconds",
                  "Completion request latency, arrival to the last byte.", latency_);
        histogram("lathe_time_to_first_token_seconds",
                  "Per sequence, from its request's arrival to its first token.",
                  s.time_to_first_token);
        histogram("lathe_time_per_output_token_seconds",
                  "Per sequence, between its consecutive tokens.", s.time_per_output_token);
        return o;
    }

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, int64_t> requests_;
    SecondsHistogram latency_;
};

// One parsed completion or chat request: its sequences (prompt-major, n per prompt) and how to
// answer.
struct Job {
    bool chat = false, stream = false, echo = false;
    int64_t n = 1;
    int64_t logprobs = -1;  // top alternatives per token; -1 = no logprobs
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> prompt_texts;  // for echo
    std::vector<SequenceParams> sequences;
};

class Server {
public:
    Server(const ServeRequest& r, const Prompting& p, std::vector<int32_t> eos, Scheduler& s,
           std::string model_id)
        : req_(r), prompting_(p), eos_(std::move(eos)), sched_(s), model_id_(std::move(model_id)) {}

    void install(httplib::Server& http);
    // Streams whose content provider has not finished (their last chunk not yet written).
    int64_t open_streams() const { return open_streams_.load(); }

private:
    using Clock = std::chrono::steady_clock;
    std::optional<ApiError> parse_common(const json& j, Job& job) const;
    std::optional<ApiError> parse_prompts(const json& j, Job& job) const;
    std::optional<ApiError> parse_messages(const json& j, Job& job) const;
    void handle(const httplib::Request& req, httplib::Response& res, bool chat);
    std::string token_text(int32_t id) const;
    json completion_choice(const Job& job, size_t k, const SequenceState& st) const;
    json chat_choice(const Job& job, size_t k, const SequenceState& st) const;
    json logprobs_json(const Job& job, size_t k, const SequenceState& st, size_t from_prompt,
                       size_t from_token, size_t offset0, size_t* offset_end = nullptr) const;

    const ServeRequest& req_;
    const Prompting& prompting_;
    std::vector<int32_t> eos_;
    Scheduler& sched_;
    std::string model_id_;
    Metrics metrics_;
    std::atomic<uint64_t> next_id_{0};
    std::atomic<int64_t> open_streams_{0};
    const int64_t created_ = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
};

// Numbers and flags of a request body, each checked for its type and range.
std::optional<ApiError> get_number(const json& j, const char* key, double lo, double hi,
                                   double& out) {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number())
        return bad(key, fmt::format("'{}' must be a number, got {}", key, describe(j[key])));
    const double v = j[key].get<double>();
    if (!(v >= lo && v <= hi)) {
        return bad(key,
                   fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, describe(j[key])));
    }
    out = v;
    return std::nullopt;
}

std::optional<ApiError> get_int(const json& j, const char* key, int64_t lo, int64_t hi,
                                int64_t& out) {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number_integer())
        return bad(key, fmt::format("'{}' must be an integer, got {}", key, describe(j[key])));
    // nlohmann keeps integers past INT64_MAX as unsigned: beyond every range here, and read as
    // int64 they would wrap to a negative number.
    const bool past_int64 =
        j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t(INT64_MAX);
    const int64_t v = past_int64 ? 0 : j[key].get<int64_t>();
    if (past_int64 || v < lo || v > hi) {
        return bad(key,
                   fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, describe(j[key])));
    }
    out = v;
    return std::nullopt;
}

std::optional<ApiError> get_bool(const json& j, const char* key, bool& out) {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_boolean())
        return bad(key, fmt::format("'{}' must be true or false, got {}", key, describe(j[key])));
    out = j[key].get<bool>();
    return std::nullopt;
}

#define API_TRY(expr)                                    \
    do {                                                 \
        if (auto api_error_ = (expr)) return api_error_; \
    } while (0)

std::optional<ApiError> Server::parse_common(const json& j, Job& job) const {
    SequenceParams base;
    base.sampling.temperature = 1.0;
    double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition = 1.0;
    int64_t top_k = 0, seed = -1, max_tokens = -1;
    API_TRY(get_number(j, "temperature", 0, 2, temperature));
    API_TRY(get_number(j, "top_p", 1e-9, 1, top_p));
    API_TRY(get_number(j, "min_p", 0, 1, min_p));
    API_TRY(get_number(j, "repetition_penalty", 1e-9, 100, repetition));
    API_TRY(get_int(j, "top_k", 0, INT32_MAX, top_k));
    API_TRY(get_int(j, "n", 1, std::max<int64_t>(1, req_.max_queue), job.n));
    API_TRY(get_int(j, "seed", INT64_MIN, INT64_MAX, seed));
    API_TRY(get_bool(j, "stream", job.stream));
    const int64_t ctx = sched_.max_len();
    const char* max_key =
        j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    // At most the context: no sequence holds more tokens. Only an integer past it exceeds the
    // context; a value of the wrong type or a negative one is a plain invalid request.
    if (auto e = get_int(j, max_key, 0, ctx, max_tokens)) {
        const json& v = j[max_key];
        if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() > ctx))
            e->code = "context_length_exceeded";
        return e;
    }
    if (j.contains("logit_bias") && !j["logit_bias"].is_null() &&
        !(j["logit_bias"].is_object() && j["logit_bias"].empty()))
        return bad("logit_bias", "'logit_bias' is not supported");
    for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
        double v = 0;
        API_TRY(get_number(j, penalty, -2, 2, v));
        if (v != 0) return bad(penalty, fmt::format("'{}' other than 0 is not supported", penalty));
    }
    std::vector<std::string> stops;
    if (j.contains("stop") && !j["stop"].is_null()) {
        const json& s = j["stop"];
        if (s.is_string()) {
            stops.push_back(s.get<std::string>());
        } else if (s.is_array()) {
            if (s.size() > kMaxStops) {
                return bad("stop",
                           fmt::format("'stop' holds {} strings, at most {}", s.size(), kMaxStops));
            }
            for (const json& x : s) {
                if (!x.is_string())
                    return bad("stop", "'stop' must be a string or a list of strings");
                stops.push_back(x.get<std::string>());
            }
        } else {
            return bad("stop", "'stop' must be a string or a list of strings");
        }
        for (const std::string& x : stops) {
            if (x.empty()) return bad("stop", "'stop' strings must not be empty");
            if (x.size() > kMaxStopBytes) {
                return bad("stop", fmt::format("a 'stop' string of {} bytes: at most {}", x.size(),
                                               kMaxStopBytes));
            }
        }
        if (!stops.empty() && !prompting_.tokenizer)
            return bad("stop", "'stop' needs the checkpoint's tokenizer.json to decode text");
    }
    base.sampling.temperature = temperature;
    base.sampling.top_p = top_p;
    base.sampling.top_k = top_k;
    base.sampling.min_p = min_p;
    base.sampling.repetition_penalty = repetition;
    base.stop_ids = eos_;
    base.stop_strings = stops;
    base.top_logprobs = job.logprobs;
    base.prompt_logprobs = job.echo && job.logprobs >= 0;
    // Without a seed, each request draws one.
    const bool seeded = j.contains("seed") && !j["seed"].is_null();
    const uint64_t seed_base = seeded ? uint64_t(seed) : uint64_t(std::random_device{}());
    if (job.chat && max_tokens == 0) return bad(max_key, fmt::format("'{}' must be >= 1", max_key));
    for (size_t i = 0; i < job.prompts.size(); ++i) {
        const int64_t len = int64_t(job.prompts[i].size());
        if (len == 0) return bad(job.chat ? "messages" : "prompt", "the prompt has no tokens");
        // Chat without max_tokens: up to the context and --default-max-tokens; completions: 16
        // (OpenAI's default).
        int64_t m = max_tokens >= 0
                        ? max_tokens
                        : (job.chat ? std::min(ctx - len, req_.default_max_tokens) : 16);
        if (len > ctx || m > ctx - len) {
            ApiError e = bad(max_key, fmt::format("the prompt's {} tokens and max_tokens {} exceed "
                                                  "the model's {}-token context",
                                                  len, m, ctx));
            if (max_tokens < 0 || len >= ctx) e.param = job.chat ? "messages" : "prompt";
            e.code = "context_length_exceeded";
            return e;
        }
        for (int64_t c = 0; c < job.n; ++c) {
            SequenceParams s = base;
            s.prompt = job.prompts[i];
            s.max_tokens = m;
            s.seed_state = sample_seed(seed_base, uint64_t(int64_t(i) * job.n + c));
            job.sequences.push_back(std::move(s));
        }
    }
    return std::nullopt;
}

std::optional<ApiError> Server::parse_prompts(const json& j, Job& job) const {
    if (!j.contains("prompt")) return bad("prompt", "'prompt' is required");
    const json& p = j["prompt"];
    // Prompts x n beyond what the queue ever holds are refused before any is tokenized.
    const int64_t count = p.is_array() && !p.empty() && !p[0].is_number() ? int64_t(p.size()) : 1;
    if (count > std::max<int64_t>(1, req_.max_queue) / job.n) {
        return bad(job.n > 1 ? "n" : "prompt",
                   fmt::format("{} prompts x n = {} exceed the queue of {} sequences (--max-queue)",
                               count, job.n, req_.max_queue));
    }
    auto ids_of = [&](const json& a, std::vector<int32_t>& ids) -> std::optional<ApiError> {
        for (const json& x : a) {
            if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
                x.get<int64_t>() >= int64_t(std::numeric_limits<int32_t>::max()))
                return bad("prompt", fmt::format("'prompt' holds {}, not a token id", describe(x)));
            ids.push_back(x.get<int32_t>());
        }
        return std::nullopt;
    };
    auto text_of = [&](const json& s) -> std::optional<ApiError> {
        Result<std::vector<int32_t>> ids = prompting_.encode_text(s.get<std::string>(), true);
        if (!ids.ok()) return bad("prompt", ids.status().message());
        job.prompts.push_back(std::move(*ids));
        job.prompt_texts.push_back(s.get<std::string>());
        return std::nullopt;
    };
    auto decoded = [&](const std::vector<int32_t>& ids) -> std::optional<ApiError> {
        std::string text;
        if (prompting_.tokenizer) {
            Result<std::string> t = prompting_.tokenizer->decode(ids, /*skip_special=*/false);
            if (!t.ok()) return bad("prompt", t.status().message());
            text = std::move(*t);
        }
        job.prompt_texts.push_back(std::move(text));
        return std::nullopt;
    };
    if (p.is_string()) {
        API_TRY(text_of(p));
    } else if (p.is_array() && !p.empty() && p[0].is_number()) {
        std::vector<int32_t> ids;
        API_TRY(ids_of(p, ids));
        API_TRY(decoded(ids));
        job.prompts.push_back(std::move(ids));
    } else if (p.is_array() && !p.empty()) {
        for (const json& x : p) {
            if (x.is_string()) {
                API_TRY(text_of(x));
            } else if (x.is_array()) {
                std::vector<int32_t> ids;
                API_TRY(ids_of(x, ids));
                API_TRY(decoded(ids));
                job.prompts.push_back(std::move(ids));
            } else {
                return bad("prompt", "'prompt' list items must be strings or lists of token ids");
            }
        }
    } else {
        return bad("prompt",
                   "'prompt' must be a string, a list of strings, a list of token ids or a list "
                   "of lists of token ids (not empty)");
    }
    return std::nullopt;
}

std::optional<ApiError> Server::parse_messages(const json& j, Job& job) const {
    if (!j.contains("messages")) return bad("messages", "'messages' is required");
    const json& m = j["messages"];
    if (!m.is_array() || m.empty())
        return bad("messages", "'messages' must be a non-empty list of {role, content}");
    for (const json& x : m) {
        if (!x.is_object() || !x.contains("role") || !x["role"].is_string() ||
            !x.contains("content") || !x["content"].is_string())
            return bad("messages", "each message must be an object with string role and content");
    }
    Result<std::vector<int32_t>> ids = prompting_.encode_messages(m);
    if (!ids.ok()) return bad("messages", ids.status().message());
    job.prompts.push_back(std::move(*ids));
    job.prompt_texts.emplace_back();
    return std::nullopt;
}

std::string Server::token_text(int32_t id) const {
    if (prompting_.tokenizer) {
        const int32_t one[1] = {id};
        Result<std::string> t = prompting_.tokenizer->decode(one, /*skip_special=*/false);
        if (t.ok()) return *t;
    }
    return fmt::format("token_id:{}", id);
}

// The completion logprobs object over prompt tokens [from_prompt, ...) (echo) and new tokens
// [from_token, ...); text_offset counts bytes from offset0 (the offset of the first token listed in
// the prompt and completion's text); *offset_end gets the offset after the last.
json Server::logprobs_json(const Job& job, size_t k, const SequenceState& st, size_t from_prompt,
                           size_t from_token, size_t offset0, size_t* offset_end) const {
    (void)k;
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    size_t offset = offset0;
    auto add = [&](const TokenLogprob& t) {
        const std::string s = token_text(t.id);
        tokens.push_back(s);
        lps.push_back(t.has_logprob ? json(t.logprob) : json(nullptr));
        if (!t.has_logprob) {
            tops.push_back(nullptr);
        } else {
            json d = json::object();
            for (const auto& [id, lp] : t.top) d[token_text(id)] = lp;
            tops.push_back(d);
        }
        offsets.push_back(offset);
        offset += s.size();
    };
    if (job.echo)
        for (size_t i = from_prompt; i < st.prompt.size(); ++i) add(st.prompt[i]);
    for (size_t i = from_token; i < st.logprobs.size(); ++i) add(st.logprobs[i]);
    if (offset_end) *offset_end = offset;
    return json{{"tokens", tokens},
                {"token_logprobs", lps},
                {"top_logprobs", tops},
                {"text_offset", offsets}};
}

json Server::completion_choice(const Job& job, size_t k, const SequenceState& st) const {
    const size_t prompt = k / size_t(job.n);
    json c;
    c["index"] = k;
    c["text"] = (job.echo ? job.prompt_texts[prompt] : std::string()) + st.text;
    // Offsets are into the prompt and completion's text: without echo the first new token's
    // offset is the prompt text's length.
    const size_t offset0 = job.echo ? 0 : job.prompt_texts[prompt].size();
    c["logprobs"] = job.logprobs >= 0 ? logprobs_json(job, k, st, 0, 0, offset0) : json(nullptr);
    c["finish_reason"] = st.finish;
    return c;
}

json Server::chat_choice(const Job& job, size_t k, const SequenceState& st) const {
    json c;
    c["index"] = k;
    c["message"] = json{{"role", "assistant"}, {"content", st.text}};
    if (job.logprobs >= 0) {
        json content = json::array();
        for (const TokenLogprob& t : st.logprobs) {
            json top = json::array();
            for (const auto& [id, lp] : t.top)
                top.push_back(json{{"token", token_text(id)}, {"logprob", lp}});
            content.push_back(
                json{{"token", token_text(t.id)}, {"logprob", t.logprob}, {"top_logprobs", top}});
        }
        c["logprobs"] = json{{"content", content}};
    } else {
        c["logprobs"] = nullptr;
    }
    c["finish_reason"] = st.finish;
    return c;
}

void Server::handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const Clock::time_point start = Clock::now();
    // One scan of the body for the request's nesting bound, inside the parse.
    json j = json_parse<json>(req.body, kMaxJsonDepth);
    if (j.is_discarded()) {
        if (json_depth(req.body, kMaxJsonDepth) > kMaxJsonDepth)
            return send_error(res, bad("", fmt::format("the request body nests arrays/objects "
                                                       "deeper than {} levels",
                                                       kMaxJsonDepth)));
        return send_error(res, bad("", "the request body is not valid JSON"));
    }
    if (!j.is_object()) return send_error(res, bad("", "the request body must be a JSON object"));
    auto job = std::make_shared<Job>();
    job->chat = chat;
    if (auto e = get_bool(j, "echo", job->echo)) return send_error(res, *e);
    if (chat) {
        job->echo = false;
        bool want = false;
        if (auto e = get_bool(j, "logprobs", want)) return send_error(res, *e);
        int64_t top = 0;
        if (auto e = get_int(j, "top_logprobs", 0, 20, top)) return send_error(res, *e);
        job->logprobs = want ? top : -1;
        if (auto e = parse_messages(j, *job)) return send_error(res, *e);
    } else {
        if (auto e = get_int(j, "logprobs", 0, 20, job->logprobs)) return send_error(res, *e);
        if (auto e = get_int(j, "n", 1, std::max<int64_t>(1, req_.max_queue), job->n))
            return send_error(res, *e);
        if (auto e = parse_prompts(j, *job)) return send_error(res, *e);
    }
    if (auto e = parse_common(j, *job)) return send_error(res, *e);
    if (int64_t(job->sequences.size()) > req_.max_queue) {
        // More sequences than the queue ever holds: no retry would help.
        return send_error(
            res, bad(job->n > 1 ? "n" : "prompt",
                     fmt::format("{} prompts x n = {} sequences exceed the queue of "
                                 "{} (--max-queue)",
                                 job->prompts.size(), job->sequences.size(), req_.max_queue)));
    }
    Result<std::vector<std::shared_ptr<SequenceTicket>>> submitted =
        sched_.submit(std::move(job->sequences));
    if (!submitted.ok())
        return send_error(res, from_status(submitted.status(), chat ? "messages" : "prompt"));
    auto tickets =
        std::make_shared<std::vector<std::shared_ptr<SequenceTicket>>>(std::move(*submitted));
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_.fetch_add(1));
    const char* object = chat ? "chat.completion" : "text_completion";

    if (!job->stream) {
        json choices = json::array();
        int64_t prompt_tokens = 0, completion_tokens = 0;
        for (size_t k = 0; k < tickets->size(); ++k) {
            SequenceState st;
            for (uint64_t v = 0; !st.done;) v = (*tickets)[k]->wait(v, st);
            if (!st.error.ok()) {
                for (auto& t : *tickets) t->cancel();
                return send_error(res, from_run_error(st.error));
            }
            if (k % size_t(job->n) == 0) prompt_tokens += int64_t(job->prompts[k / job->n].size());
            completion_tokens += int64_t(st.ids.size());
            choices.push_back(chat ? chat_choice(*job, k, st) : completion_choice(*job, k, st));
        }
        json out;
        out["id"] = id;
        out["object"] = object;
        out["created"] = created_;
        out["model"] = model_id_;
        out["choices"] = choices;
        out["usage"] = json{{"prompt_tokens", prompt_tokens},
                            {"completion_tokens", completion_tokens},
                            {"total_tokens", prompt_tokens + completion_tokens}};
        res.set_content(dump(out), "application/json");
        metrics_.latency(std::chrono::duration<double>(Clock::now() - start).count());
        return;
    }

    // Streaming: server-sent events, one chunk per change of any choice, then [DONE].
    struct Progress {
        uint64_t version = 0;
        size_t text = 0, tokens = 0;
        size_t offset = 0;  // text_offset of the next token listed
        bool started = false, finished = false;
    };
    auto progress = std::make_shared<std::vector<Progress>>(tickets->size());
    res.set_header("Cache-Control", "no-cache");
    open_streams_.fetch_add(1);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, tickets, progress, id, chat](size_t, httplib::DataSink& sink) {
            auto chunk = [&](size_t k, const json& choice) {
                json out;
                out["id"] = id;
                out["object"] = chat ? "chat.completion.chunk" : "text_completion";
                out["created"] = created_;
                out["model"] = model_id_;
                out["choices"] = json::array({choice});
                const std::string s = "data: " + dump(out) + "\n\n";
                (void)k;
                return sink.write(s.data(), s.size());
            };
            // The first unfinished choice: wait for its next change, then send every choice's.
            size_t open = tickets->size();
            for (size_t k = 0; k < tickets->size(); ++k)
                if (!(*progress)[k].finished) {
                    open = k;
                    break;
                }
            if (open == tickets->size()) {
                const std::string done = "data: [DONE]\n\n";
                sink.write(done.data(), done.size());
                sink.done();
                return true;
            }
            SequenceState st;
            (*progress)[open].version = (*tickets)[open]->wait((*progress)[open].version, st);
            for (size_t k = 0; k < tickets->size(); ++k) {
                Progress& pr = (*progress)[k];
                if (pr.finished) continue;
                if (k != open) st = (*tickets)[k]->snapshot();
                if (!st.error.ok()) {
                    json err{{"error", json{{"message", st.error.message()},
                                            {"type", "server_error"},
                                            {"param", nullptr},
                                            {"code", nullptr}}}};
                    // The error event, then the stream's usual end: clients see a clean close.
                    const std::string s = "data: " + dump(err) + "\n\ndata: [DONE]\n\n";
                    for (auto& t : *tickets) t->cancel();
                    for (Progress& other : *progress) other.finished = true;
                    if (!sink.write(s.data(), s.size())) return false;
                    sink.done();
                    return true;
                }
                const size_t upto = st.done ? st.text.size() : st.stable_text;
                const bool changed =
                    upto > pr.text || st.ids.size() > pr.tokens || st.done || !pr.started;
                if (!changed) continue;
                json c;
                c["index"] = k;
                const std::string delta = st.text.substr(pr.text, upto - pr.text);
                if (chat) {
                    json d = json::object();
                    if (!pr.started) d["role"] = "assistant";
                    d["content"] = delta;
                    c["delta"] = d;
                    c["logprobs"] = nullptr;
                } else {
                    const std::string echo =
                        (!pr.started && job->echo) ? job->prompt_texts[k / size_t(job->n)] : "";
                    c["text"] = echo + delta;
                    // Offsets go on from the chunk before (the first: as completion_choice).
                    if (!pr.started && !job->echo)
                        pr.offset = job->prompt_texts[k / size_t(job->n)].size();
                    c["logprobs"] =
                        job->logprobs >= 0
                            ? logprobs_json(*job, k, st, pr.started ? st.prompt.size() : 0,
                                            pr.tokens, pr.offset, &pr.offset)
                            : json(nullptr);
                }
                c["finish_reason"] = st.done ? json(st.finish) : json(nullptr);
                pr.started = true;
                pr.text = upto;
                pr.tokens = st.logprobs.size();
                if (st.done) pr.finished = true;
                if (!chunk(k, c)) {
                    // The client went away: its sequences leave at the next step.
                    for (auto& t : *tickets) t->cancel();
                    return false;
                }
            }
            return true;
        },
        [this, tickets, start](bool) {
            open_streams_.fetch_sub(1);
            for (auto& t : *tickets) t->cancel();
            metrics_.latency(std::chrono::duration<double>(Clock::now() - start).count());
        });
}

void Server::install(httplib::Server& http) {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (req_.api_key.empty() || req.path == "/health")
            return httplib::Server::HandlerResponse::Unhandled;
        if (req.get_header_value("Authorization") == "Bearer " + req_.api_key)
            return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.http = 401;
        e.message = "a valid API key is required: 'Authorization: Bearer KEY'";
        e.code = "invalid_api_key";
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
    });
    http.Post("/v1/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle(q, r, false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& q, httplib::Response& r) { handle(q, r, true); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
        json m{{"id", model_id_},
               {"object", "model"},
               {"created", created_},
               {"owned_by", "lathe"},
               {"max_model_len", sched_.max_len()}};
        r.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}),
                      "application/json");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& r) {
        r.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
        r.set_content(metrics_.text(sched_.stats()), "text/plain; version=0.0.4");
    });
    http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (DeadlineServer::request_expired()) {
            ApiError e;
            e.http = 408;
            e.code = "request_timeout";
            e.message = fmt::format(
                "the request did not arrive whole within {} s (--request-read-timeout-s)",
                req_.request_read_timeout_s);
            return send_error(res, e);
        }
        if (DeadlineServer::request_head_too_large()) {
            ApiError e;
            e.http = 431;
            e.code = "request_header_too_large";
            e.message = fmt::format("the request line and headers exceed {} bytes",
                                    DeadlineStream::kMaxHeadBytes);
            return send_error(res, e);
        }
        if (!res.body.empty()) return;  // an error a handler wrote already
        ApiError e;
        e.http = res.status;
        e.message = res.status == 404 ? fmt::format("no route {} {}", req.method, req.path)
                                      : fmt::format("HTTP {}", res.status);
        if (res.status == 404) e.code = "not_found";
        if (res.status == 413) {
            e.message = fmt::format("the request body exceeds {} bytes (--max-body-bytes)",
                                    req_.max_body_bytes);
        }
        send_error(res, e);
    });
    // A request that missed its deadline or whose head ran too long ends its connection
    // (DeadlineServer): its 408 or 431 says so, in place of the library's keep-alive offer.
    http.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
        if (!DeadlineServer::request_expired() && !DeadlineServer::request_head_too_large()) return;
        res.headers.erase("Keep-Alive");
        if (!res.has_header("Connection")) res.set_header("Connection", "close");
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            ApiError e;
            e.http = 500;
            e.type = "server_error";
            e.message = "internal error";
            try {
                if (ep) std::rethrow_exception(ep);
            } catch (const std::exception& x) {
                e.message = x.what();
            } catch (...) {
            }
            send_error(res, e);
        });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
        static const char* known[] = {"/v1/completions", "/v1/chat/completions", "/v1/models",
                                      "/health", "/metrics"};
        std::string path = "other";
        for (const char* k : known)
            if (req.path == k) path = k;
        metrics_.count(path, res.status);
    });
}

// SIGINT/SIGTERM set this flag (a handler reaches only static storage); the handlers are one-shot
// (SA_RESETHAND): a second signal ends the process at once.
std::atomic<bool>& serve_stop_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

extern "C" void serve_on_signal(int) {
    serve_stop_flag().store(true);
}

void serve_install_signal_handlers() {
    struct sigaction sa {};
    sa.sa_handler = serve_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

Status run_serve(const ServeRequest& r) {
    if (r.port < 0 || r.port > 65535)
        return invalid_argument_error("--port must be in [0, 65535], got {}", r.port);
    // Each flag within a range its uses (thread counts, block arithmetic) cannot overflow.
    auto in_range = [](const char* flag, int64_t v, int64_t lo, int64_t hi) -> Status {
        if (v < lo || v > hi)
            return invalid_argument_error("{} must be in [{}, {}], got {}", flag, lo, hi, v);
        return ok_status();
    };
    LATHE_RETURN_IF_ERROR(in_range("--max-seqs", r.max_seqs, 1, 4096));
    LATHE_RETURN_IF_ERROR(in_range("--max-queue", r.max_queue, 1, 1 << 16));
    LATHE_RETURN_IF_ERROR(in_range("--max-len", r.max_len, 0, int64_t(1) << 24));
    LATHE_RETURN_IF_ERROR(in_range("--prefill-chunk", r.prefill_chunk, 0, int64_t(1) << 20));
    LATHE_RETURN_IF_ERROR(in_range("--kv-blocks", r.kv_blocks, 0, int64_t(1) << 24));
    LATHE_RETURN_IF_ERROR(
        in_range("--default-max-tokens", r.default_max_tokens, 1, int64_t(1) << 24));
    LATHE_RETURN_IF_ERROR(in_range("--request-read-timeout-s", r.request_read_timeout_s, 1, 3600));
    if (r.kv_block_size_given)
        LATHE_RETURN_IF_ERROR(in_range("--kv-block-size", r.kv_block_size, 0, 1 << 16));
    if (r.max_body_bytes < 1024 || r.max_body_bytes > (int64_t(1) << 30)) {
        return invalid_argument_error("--max-body-bytes must be in [1024, 2^30], got {}",
                                      r.max_body_bytes);
    }
    const Result<fs::path> resolved = resolve_checkpoint(r.checkpoint);
    if (!resolved.ok()) return resolved.status().with_context("--checkpoint");
    const fs::path dir = *resolved;
    Result<Prompting> prompting = Prompting::load(dir);
    if (!prompting.ok()) return prompting.status().with_context("--checkpoint");
    LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> eos, read_eos_ids(dir));
    auto config = model_config_from_hf_file(dir.string());
    if (!config.ok()) return config.status().with_context("--checkpoint");
    if (r.max_len > config->max_position_embeddings) {
        return invalid_argument_error("--max-len {} exceeds the model's {}-token context",
                                      r.max_len, config->max_position_embeddings);
    }
    // Tensor parallel: one process per rank, the world of this job.
    LATHE_ASSIGN_OR_RETURN(InferenceProcesses procs,
                           inference_processes_open(*config, r.tensor_parallel, r.device, "serve"));
    const ComputeDevice& device = procs.device;
    std::optional<World>& world = procs.world;
    const int tp = procs.tensor_parallel, rank = procs.rank();
    Result<Model> made = inference_model_create(*config, procs, r.random_weights, dir);
    if (!made.ok()) return made.status();
    Model model = std::move(*made);
    EngineLimits limits;
    limits.max_sequences = r.max_seqs;
    limits.max_len = r.max_len > 0 ? r.max_len : config->max_position_embeddings;
    limits.prefill_chunk = inference_prefill_chunk(r.prefill_chunk, procs, limits.max_len);
    // Paged by default on both backends, so that a request holds the blocks its length needs,
    // not a row of max_len; the row cache where the CUDA paged decode attention cannot take the
    // model (its head_dim, or its GQA group beyond this GPU's shared memory per block).
    const Status paged_ok = InferenceEngine::paged_cache_supported(*config, device.context());
    if (r.kv_block_size < 0 && !paged_ok.ok())
        log_info("serve: the row KV cache ({})", paged_ok.message());
    limits.kv_block_size = r.kv_block_size >= 0 ? r.kv_block_size : (paged_ok.ok() ? 16 : 0);
    limits.kv_blocks = r.kv_blocks;
    limits.cuda_graphs = r.cuda_graphs;
    LATHE_ASSIGN_OR_RETURN(limits.peer_reduce, peer_reduce_parse(r.peer_reduce, "--peer-reduce"));
    LATHE_ASSIGN_OR_RETURN(limits.decode_gemv, decode_gemv_parse(r.decode_gemv, "--decode-gemv"));
    Result<InferenceEngine> created =
        InferenceEngine::create(model, limits, world ? world->comm.get() : nullptr);
    if (!created.ok()) return created.status().with_context("--kv-block-size, --kv-blocks");
    InferenceEngine engine = std::move(*created);
    if (world && rank != 0) {
        // A signal to the job (mpirun passes it on to every rank) ends rank 0's server, which
        // then releases this rank: here it only sets the flag.
        serve_install_signal_handlers();
        return engine.follow();  // rank 0's calls, until it stops
    }
    // Rank 0 of several: the others wait in follow() until this process releases them, on every
    // way out of here.
    engine.lead();
    struct Release {
        InferenceEngine& e;
        ~Release() {
            if (Status s = e.stop_followers(); !s.ok())
                std::fprintf(stderr, "lathe serve: %s\n", s.to_string().c_str());
        }
    } release{engine};

    const Prompting& p = *prompting;
    Detokenizer detok;
    if (p.tokenizer) detok = [&p](std::span<const int32_t> ids) { return p.decode(ids); };
    serve_install_signal_handlers();

    Scheduler scheduler(engine, detok, r.max_queue);
    std::string model_id = r.model_name;
    if (model_id.empty()) model_id = dir.filename().string();
    if (model_id.empty()) model_id = dir.parent_path().filename().string();
    Server server(r, p, eos, scheduler, model_id);
    // Each waiting or streaming request holds a pool thread; idle keep-alive connections too, and
    // requests still arriving, until their deadline (DeadlineServer).
    const size_t threads = size_t(std::min<int64_t>(512, 2 * (r.max_seqs + r.max_queue) + 16));
    DeadlineServer http(threads, std::chrono::seconds(r.request_read_timeout_s));
    http.set_keep_alive_timeout(2);
    http.set_payload_max_length(size_t(r.max_body_bytes));
    server.install(http);
    // SO_REUSEADDR alone: cpp-httplib's default adds SO_REUSEPORT, with which a second server
    // binds a port already served and the kernel splits the clients between the two.
    // The callback sees each socket the bind tries, before its bind: the last is the one bound.
    socket_t listening = INVALID_SOCKET;
    http.set_socket_options([&listening](socket_t sock) {
        const int yes = 1;
        setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        listening = sock;
    });
    const int port = r.port == 0 ? http.bind_to_any_port(r.host)
                                 : (http.bind_to_port(r.host, r.port) ? r.port : -1);
    if (port < 0) {
        return io_error(
            "cannot listen on {}:{} (--host, --port): the address is taken or not "
            "local",
            r.host, r.port);
    }
    // cpp-httplib 0.11 listens with a backlog of 5: of a burst of new connections (a benchmark's
    // clients opening together) the rest would wait for the kernel's SYN retransmit, a second
    // and more. Linux takes a second listen() on a listening socket as its new backlog, and cuts
    // any larger one to net.core.somaxconn.
    if (listening != INVALID_SOCKET && ::listen(listening, INT_MAX) != 0)
        log_warning("lathe serve: listen backlog: {}; bursts of connections may wait a second",
                    std::strerror(errno));
    if (world) {
        std::fprintf(stderr,
                     "lathe serve: %s on http://%s:%d (%lld sequences, queue %lld, %lld-token "
                     "context, tensor parallel %d)\n",
                     model_id.c_str(), r.host.c_str(), port, (long long)r.max_seqs,
                     (long long)r.max_queue, (long long)limits.max_len, tp);
        std::fflush(stderr);
        // The HTTP server listens on a thread of its own; this thread runs the scheduler (and so
        // every collective) until a signal or the server's end.
        std::atomic<bool> listened{false}, listening_done{false};
        std::thread listener([&] {
            listened.store(http.listen_after_bind());
            listening_done.store(true);
        });
        while (!serve_stop_flag().load() && !listening_done.load()) {
            if (!scheduler.step()) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        std::fprintf(stderr, "lathe serve: stopping\n");
        scheduler.stop();
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (server.open_streams() > 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        http.stop();
        listener.join();
        if (!listened.load() && !serve_stop_flag().load())
            return io_error("the server on {}:{} stopped with an error", r.host, port);
        return ok_status();
    }
    scheduler.start();
    // The signal handler only sets a flag; this thread polls it and stops the server.
    std::atomic<bool> listening_done{false};
    std::thread waiter([&] {
        while (!listening_done.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            if (serve_stop_flag().load()) {
                std::fprintf(stderr, "lathe serve: stopping\n");
                // Waiting and streaming handlers end first (their sequences fail as cancelled),
                // so that the HTTP pool's threads can be joined.
                scheduler.stop();
                // Streams write their error event and [DONE] before the server stops (which
                // ends chunked writes); a client that does not read is waited for 2 s at most.
                const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
                while (server.open_streams() > 0 && std::chrono::steady_clock::now() < until)
                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                http.stop();
                return;
            }
        }
    });
    std::fprintf(stderr,
                 "lathe serve: %s on http://%s:%d (%lld sequences, queue %lld, %lld-token "
                 "context)\n",
                 model_id.c_str(), r.host.c_str(), port, (long long)r.max_seqs,
                 (long long)r.max_queue, (long long)limits.max_len);
    std::fflush(stderr);
    const bool listened = http.listen_after_bind();
    listening_done.store(true);
    waiter.join();
    scheduler.stop();
    if (!listened) return io_error("the server on {}:{} stopped with an error", r.host, port);
    return ok_status();
}

#else

Status run_serve(const ServeRequest&) {
    return unimplemented_error(
        "this lathe was built without cpp-httplib: install libcpp-httplib-dev "
        "(scripts/install-deps.sh), rerun cmake and rebuild");
}

#endif  // LATHE_HAVE_HTTPLIB

}  // namespace

void cli_add_serve(CLI::App& parent, CommandAction& action) {
    auto req = std::make_shared<ServeRequest>();
    CLI::App* cmd = parent.add_subcommand(
        "serve",
        "Serve a checkpoint over an OpenAI-compatible HTTP API with continuous batching "
        "(docs/INFERENCE.md)");
    cmd->add_option("--checkpoint", req->checkpoint,
                    "A lathe checkpoint or Hugging Face folder (config.json, safetensors, "
                    "tokenizer.json for text)")
        ->required();
    cmd->add_option("--host", req->host, "Address to bind")->capture_default_str();
    cmd->add_option("--port", req->port, "Port (0 = any free port, printed)")
        ->capture_default_str();
    cmd->add_option("--device", req->device, "auto | cpu | cuda")->capture_default_str();
    cmd->add_option("--api-key", req->api_key,
                    "Require 'Authorization: Bearer KEY' on /v1/* and /metrics");
    cmd->add_option("--max-seqs", req->max_seqs, "Sequences decoded together (KV cache rows)")
        ->capture_default_str();
    cmd->add_option("--max-queue", req->max_queue,
                    "Sequences waiting at most; more are answered 503")
        ->capture_default_str();
    cmd->add_option("--max-len", req->max_len,
                    "Tokens per sequence (prompt and output); 0 = the model's context")
        ->capture_default_str();
    cmd->add_option("--prefill-chunk", req->prefill_chunk,
                    "Prompt tokens of one prefill forward (at most --max-len); 0 = 2048 on CUDA, "
                    "256 on the CPU. Longer chunks read the weights fewer times per prompt")
        ->capture_default_str();
    CLI::Option* block_size =
        cmd->add_option("--kv-block-size", req->kv_block_size,
                        "Positions per paged KV block (default 16; on CUDA the row cache when "
                        "the paged decode attention cannot take the model's head_dim or GQA "
                        "group); 0 = one row of --max-len per sequence");
    cli_add_decode_gemv(cmd, req->decode_gemv);
    cli_add_peer_reduce(cmd, req->peer_reduce);
    cmd->add_option("--kv-blocks", req->kv_blocks,
                    "Paged KV pool in blocks (default: --max-seqs full-length sequences)");
    cmd->add_option("--max-body-bytes", req->max_body_bytes,
                    "Largest request body; larger ones are answered 413")
        ->capture_default_str();
    cmd->add_option("--request-read-timeout-s", req->request_read_timeout_s,
                    "Seconds a client has to send a whole request (headers and body), from its "
                    "connection's accept or its previous response's end; a request still arriving "
                    "then is answered 408 and its connection closed, so that slow clients cannot "
                    "hold the server's threads. Responses (streams included) are not limited")
        ->capture_default_str();
    cmd->add_option("--default-max-tokens", req->default_max_tokens,
                    "max_tokens of a chat request that names none (and at most the remaining "
                    "context); completions default to 16")
        ->capture_default_str();
    cmd->add_option("--model-name", req->model_name,
                    "The model id of /v1/models (default: the checkpoint folder's name)");
    cmd->add_option("--cuda-graphs", req->cuda_graphs,
                    "1 = replay each decode step of the paged CUDA cache from a CUDA graph of "
                    "its batch bucket (with --tensor-parallel too), 0 = launch kernels one by one")
        ->capture_default_str();
    cmd->add_option("--tensor-parallel", req->tensor_parallel,
                    "Processes (GPUs) sharing the model's heads and MLP; must equal the job's "
                    "process count; rank 0 serves (docs/INFERENCE.md)")
        ->capture_default_str();
    cmd->add_option("--random-weights", req->random_weights,
                    "Draw the weights from this seed instead of reading safetensors (timing a "
                    "shape from its config.json alone; the output is noise)");
    cmd->callback([req, block_size, &action] {
        req->kv_block_size_given = block_size->count() > 0;
        action = [req] { return run_serve(*req); };
    });
}

}  // namespace lathe
