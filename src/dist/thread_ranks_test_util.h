#pragma once
// Shared by dist tests: a group of ranks that are threads of one process, so tests of code built on
// host collectives (dist/host_collectives.h) run several ranks without mpirun. Only all_gather is
// implemented (host memory): each rank posts its input, waits for every rank, copies every chunk,
// and waits again before its input may be reused. Other collectives are bugs here.
//
//   run_thread_ranks(4, [](Communicator& comm) { ... });   // the body on ranks 0..3, joined

#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/check.h"
#include "dist/communicator.h"

namespace lathe::testutil {

class ThreadRanksCommunicator final : public Communicator {
public:
    struct Shared {
        explicit Shared(int size) : inputs(size_t(size)), sync(size) {}
        std::vector<const void*> inputs;
        std::barrier<> sync;
    };

    ThreadRanksCommunicator(std::shared_ptr<Shared> shared, int rank, int size)
        : shared_(std::move(shared)), rank_(rank), size_(size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string_view backend() const override { return "threads"; }
    bool accepts(Device device) const override { return device == Device::kCpu; }

private:
    Status do_all_gather(TensorView out, ConstTensorView in, CUstream_st*) override {
        shared_->inputs[size_t(rank_)] = in.data();
        shared_->sync.arrive_and_wait();
        for (int r = 0; r < size_; ++r)
            std::memmove(static_cast<char*>(out.data()) + size_t(r) * in.bytes(),
                         shared_->inputs[size_t(r)], in.bytes());
        shared_->sync.arrive_and_wait();
        return ok_status();
    }
    Status do_all_reduce(TensorView, ConstTensorView, ReduceOp, CUstream_st*) override {
        LATHE_CHECK(false, "ThreadRanksCommunicator: only all_gather");
        return ok_status();
    }
    Status do_reduce_scatter(TensorView, ConstTensorView, ReduceOp, CUstream_st*) override {
        LATHE_CHECK(false, "ThreadRanksCommunicator: only all_gather");
        return ok_status();
    }
    Status do_broadcast(TensorView, int, CUstream_st*) override {
        LATHE_CHECK(false, "ThreadRanksCommunicator: only all_gather");
        return ok_status();
    }
    Result<std::unique_ptr<Communicator>> do_split(int, int) override {
        LATHE_CHECK(false, "ThreadRanksCommunicator: only all_gather");
        return std::unique_ptr<Communicator>();
    }

    std::shared_ptr<Shared> shared_;
    int rank_;
    int size_;
};

// Runs body(comm) on `size` threads, rank r's comm being rank r of one group; returns once all end.
inline void run_thread_ranks(int size, const std::function<void(Communicator&)>& body) {
    auto shared = std::make_shared<ThreadRanksCommunicator::Shared>(size);
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r)
        threads.emplace_back([&, r] {
            ThreadRanksCommunicator comm(shared, r, size);
            body(comm);
        });
    for (std::thread& t : threads) t.join();
}

}  // namespace lathe::testutil
