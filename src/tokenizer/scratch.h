#pragma once
// Reusable per-thread string buffers (internal to src/tokenizer), so that components that need a
// temporary string on the encode hot path (a Sequence normalizer's intermediate text, a Split
// pre-tokenizer's match list) allocate only until the buffers have grown to their working size.
// Nesting is safe: each ScratchString takes its own buffer from the thread's pool and gives it
// back on destruction.

#include <string>
#include <utility>
#include <vector>

namespace lathe {

template <typename T>
class ScratchPool {
public:
    static std::vector<T>& pool() {
        thread_local std::vector<T> buffers;
        return buffers;
    }
};

// A cleared buffer of type T (std::string, std::vector<...>) borrowed from the thread's pool.
template <typename T>
class Scratch {
public:
    Scratch() {
        auto& pool = ScratchPool<T>::pool();
        if (!pool.empty()) {
            value_ = std::move(pool.back());
            pool.pop_back();
        }
        value_.clear();
    }
    ~Scratch() {
        auto& pool = ScratchPool<T>::pool();
        if (pool.size() < kMaxPooled) pool.push_back(std::move(value_));
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    T& operator*() { return value_; }
    T* operator->() { return &value_; }

private:
    static constexpr size_t kMaxPooled = 16;
    T value_;
};

using ScratchString = Scratch<std::string>;

}  // namespace lathe
