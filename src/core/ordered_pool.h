#pragma once
// An ordered parallel map over batches: the calling thread reads batches and writes results in
// input order, worker threads process them in any order, and at most 2 batches per worker are in
// flight (which bounds memory).

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lathe {

// Runs the pipeline read -> work -> write over batches of type `Batch`:
//   read(Batch&) -> Result<bool>   on the calling thread: fills the batch (reusing its buffers);
//                                  false at the end of the input.
//   make_worker() -> callable      on each worker thread, once: returns that thread's
//                                  `Status work(Batch&)` (so per-thread state such as caches and
//                                  parsers stays warm and needs no locking).
//   write(Batch&) -> Status        on the calling thread, once per batch, in the order read
//                                  produced them.
// The first error in input order is returned: a read error, or the status of the first batch
// whose work failed (batches before it are written, batches after it are not), or a write error.
// threads <= 1 runs everything on the calling thread.
template <class Batch, class MakeWorker, class Read, class Write>
Status ordered_parallel_map(int threads, MakeWorker&& make_worker, Read&& read, Write&& write) {
    if (threads <= 1) {
        auto work = make_worker();
        Batch b;
        while (true) {
            LATHE_ASSIGN_OR_RETURN(bool more, read(b));
            if (!more) return ok_status();
            LATHE_RETURN_IF_ERROR(work(b));
            LATHE_RETURN_IF_ERROR(write(b));
        }
    }

    struct Slot {
        Batch batch;
        Status status;
        bool done = false;
    };
    struct Pool {
        std::mutex mu;
        std::condition_variable work_cv;
        std::condition_variable done_cv;
        std::deque<Slot*> queue;
        bool stop = false;
        std::vector<std::thread> workers;
        // Stops and joins the workers on every way out of the function, errors included.
        ~Pool() {
            {
                std::lock_guard<std::mutex> lock(mu);
                stop = true;
                queue.clear();
            }
            work_cv.notify_all();
            for (std::thread& t : workers) t.join();
        }
    };

    const size_t max_in_flight = static_cast<size_t>(2 * threads);
    std::vector<std::unique_ptr<Slot>> slots;
    std::vector<Slot*> free_slots;
    for (size_t i = 0; i < max_in_flight; ++i) {
        slots.push_back(std::make_unique<Slot>());
        free_slots.push_back(slots.back().get());
    }
    std::deque<Slot*> in_flight;

    Pool pool;
    for (int i = 0; i < threads; ++i) {
        pool.workers.emplace_back([&pool, &make_worker] {
            auto work = make_worker();
            while (true) {
                Slot* s = nullptr;
                {
                    std::unique_lock<std::mutex> lock(pool.mu);
                    pool.work_cv.wait(lock, [&pool] { return pool.stop || !pool.queue.empty(); });
                    if (pool.queue.empty()) return;
                    s = pool.queue.front();
                    pool.queue.pop_front();
                }
                Status status = work(s->batch);
                {
                    std::lock_guard<std::mutex> lock(pool.mu);
                    s->status = std::move(status);
                    s->done = true;
                }
                pool.done_cv.notify_all();
            }
        });
    }

    bool eof = false;
    while (!eof || !in_flight.empty()) {
        while (!eof && !free_slots.empty()) {
            Slot* s = free_slots.back();
            LATHE_ASSIGN_OR_RETURN(bool more, read(s->batch));
            if (!more) {
                eof = true;
                break;
            }
            free_slots.pop_back();
            s->done = false;
            s->status = ok_status();
            in_flight.push_back(s);
            {
                std::lock_guard<std::mutex> lock(pool.mu);
                pool.queue.push_back(s);
            }
            pool.work_cv.notify_one();
        }
        if (in_flight.empty()) break;
        Slot* front = in_flight.front();
        {
            std::unique_lock<std::mutex> lock(pool.mu);
            pool.done_cv.wait(lock, [front] { return front->done; });
        }
        in_flight.pop_front();
        LATHE_RETURN_IF_ERROR(front->status);
        LATHE_RETURN_IF_ERROR(write(front->batch));
        free_slots.push_back(front);
    }
    return ok_status();
}

}  // namespace lathe
