#pragma once
// A map with a bound on its entry count: inserting a new key into a full cache first evicts the
// least recently used entry (find and insert count as uses; contains does not). For caches of
// objects that are expensive to build and hold memory, keyed by a shape that varies at run time
// (the cuDNN attention graphs of ops/cuda/attention.cu, one per inference prompt length).
// Values live in list nodes: a pointer or reference to one stays valid until that entry is evicted
// or replaced. Not thread-safe (each user holds its own, used from one thread).
#include <cstddef>
#include <functional>
#include <iterator>
#include <list>
#include <unordered_map>
#include <utility>

#include "core/check.h"

namespace lathe {

template <class Key, class Value, class Hash = std::hash<Key>>
class LruCache {
public:
    explicit LruCache(size_t capacity) : capacity_(capacity) {
        LATHE_CHECK(capacity > 0, "LruCache: a capacity of 0 entries");
    }

    // The value cached for `key`, marked most recently used; null when absent.
    Value* find(const Key& key) {
        auto it = index_.find(key);
        if (it == index_.end()) return nullptr;
        entries_.splice(entries_.begin(), entries_, it->second);
        return &it->second->second;
    }

    bool contains(const Key& key) const { return index_.count(key) != 0; }

    // Whether inserting a key not in the cache would evict an entry.
    bool full() const { return entries_.size() >= capacity_; }

    // Caches `value` for `key` (replacing an entry with that key), most recently used; evicts the
    // least recently used entry first when a new key finds the cache full.
    Value& insert(const Key& key, Value value) {
        if (auto it = index_.find(key); it != index_.end()) {
            it->second->second = std::move(value);
            entries_.splice(entries_.begin(), entries_, it->second);
            return it->second->second;
        }
        if (full()) {
            index_.erase(entries_.back().first);
            entries_.pop_back();
            ++evictions_;
        }
        entries_.emplace_front(key, std::move(value));
        index_.emplace(key, entries_.begin());
        return entries_.front().second;
    }

    // Fewer entries: the least recently used go first.
    void set_capacity(size_t capacity) {
        LATHE_CHECK(capacity > 0, "LruCache: a capacity of 0 entries");
        capacity_ = capacity;
        while (entries_.size() > capacity_) {
            index_.erase(entries_.back().first);
            entries_.pop_back();
            ++evictions_;
        }
    }

    size_t size() const { return entries_.size(); }
    size_t capacity() const { return capacity_; }
    // Entries evicted since construction (for tests and logs).
    size_t evictions() const { return evictions_; }

private:
    using Entries = std::list<std::pair<Key, Value>>;
    size_t capacity_;
    size_t evictions_ = 0;
    Entries entries_;  // most recently used first
    std::unordered_map<Key, typename Entries::iterator, Hash> index_;
};

}  // namespace lathe
