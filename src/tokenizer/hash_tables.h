#pragma once
// Flat open-addressing hash tables for the tokenizer's hot path (internal to src/tokenizer):
// a string -> id map whose keys live in one arena (looked up by string_view, no allocation), and
// a (left id, right id) -> merge map. Both are built once and then only read, so lookups are
// thread-safe. Linear probing over a power-of-two table kept at most half full.

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/hash.h"

namespace lathe {

// An allocator for the large lookup tables: blocks of 2 MiB or more are 2 MiB-aligned and marked
// for transparent huge pages, because random lookups into multi-megabyte tables otherwise spend
// much of their time on TLB misses. Smaller blocks come from operator new.
template <typename T>
struct HugePageAllocator {
    using value_type = T;
    static constexpr size_t kHugePage = size_t{2} << 20;
    HugePageAllocator() = default;
    template <typename U>
    HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding
    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        if (bytes < kHugePage) return static_cast<T*>(::operator new(bytes));
        const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
        void* p = std::aligned_alloc(kHugePage, rounded);
        if (p == nullptr) throw std::bad_alloc();
        madvise(p, rounded, MADV_HUGEPAGE);  // a hint: failure only costs speed
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t n) {
        if (n * sizeof(T) < kHugePage) {
            ::operator delete(p);
        } else {
            std::free(p);
        }
    }
    template <typename U>
    bool operator==(const HugePageAllocator<U>&) const {
        return true;
    }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

// string -> int32 id. insert() after build is allowed (rehashes as needed); a repeated key keeps
// the id of the last insert (as a Rust HashMap collected from a JSON object does).
class StringIdMap {
public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < 2 * n) cap <<= 1;
        if (cap > slots_.size()) rehash(cap);
    }
    void insert(std::string_view key, int32_t id) {
        if (2 * (count_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
        const uint64_t h = hash_bytes(key.data(), key.size());
        size_t i = h & (slots_.size() - 1);
        while (true) {
            Slot& s = slots_[i];
            if (s.len == kEmpty) {
                s.offset = static_cast<uint32_t>(arena_.size());
                s.len = static_cast<uint32_t>(key.size());
                s.id = id;
                s.hash32 = static_cast<uint32_t>(h >> 32);
                arena_.append(key);
                ++count_;
                return;
            }
            if (s.hash32 == static_cast<uint32_t>(h >> 32) && key_of(s) == key) {
                s.id = id;
                return;
            }
            i = (i + 1) & (slots_.size() - 1);
        }
    }
    std::optional<int32_t> find(std::string_view key) const {
        return find(key, hash_bytes(key.data(), key.size()));
    }
    // find() with the key's hash_bytes() already computed.
    std::optional<int32_t> find(std::string_view key, uint64_t h) const {
        if (slots_.empty()) return std::nullopt;
        size_t i = h & (slots_.size() - 1);
        while (true) {
            const Slot& s = slots_[i];
            if (s.len == kEmpty) return std::nullopt;
            if (s.hash32 == static_cast<uint32_t>(h >> 32) && s.len == key.size() &&
                std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
                return s.id;
            }
            i = (i + 1) & (slots_.size() - 1);
        }
    }
    // Prefetch hints for batched lookups (loading resolves hundreds of thousands of merges, each a
    // few lookups that would otherwise wait on memory one after another): first the home slot of
    // a hash, then (once that slot is cached) the key bytes it points to.
    void prefetch_slot(uint64_t h) const {
        if (!slots_.empty()) __builtin_prefetch(&slots_[h & (slots_.size() - 1)]);
    }
    void prefetch_key(uint64_t h) const {
        if (slots_.empty()) return;
        const Slot& s = slots_[h & (slots_.size() - 1)];
        if (s.len != kEmpty) __builtin_prefetch(arena_.data() + s.offset);
    }
    size_t size() const { return count_; }
    // The key bytes at an arena position reported by for_each_ref (valid until the next insert).
    std::string_view key_at(uint32_t offset, uint32_t len) const {
        return std::string_view(arena_.data() + offset, len);
    }
    // Calls fn(key, id, arena offset) for every entry (in no particular order).
    template <typename Fn>
    void for_each_ref(Fn fn) const {
        for (const Slot& s : slots_) {
            if (s.len != kEmpty) fn(key_of(s), s.id, s.offset);
        }
    }
    // Calls fn(key, id) for every entry (in no particular order).
    template <typename Fn>
    void for_each(Fn fn) const {
        for (const Slot& s : slots_) {
            if (s.len != kEmpty) fn(key_of(s), s.id);
        }
    }

private:
    static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
    struct Slot {
        uint32_t offset = 0;
        uint32_t len = kEmpty;
        int32_t id = 0;
        uint32_t hash32 = 0;
    };
    std::string_view key_of(const Slot& s) const {
        return std::string_view(arena_.data() + s.offset, s.len);
    }
    void rehash(size_t cap) {
        HugePageVector<Slot> old;
        old.swap(slots_);
        slots_.assign(cap, Slot{});
        for (const Slot& s : old) {
            if (s.len == kEmpty) continue;
            const uint64_t h = hash_bytes(arena_.data() + s.offset, s.len);
            size_t i = h & (cap - 1);
            while (slots_[i].len != kEmpty) i = (i + 1) & (cap - 1);
            slots_[i] = s;
        }
    }
    HugePageVector<Slot> slots_;
    std::string arena_;
    size_t count_ = 0;
};

// (left id, right id) -> (rank, merged id). A repeated pair keeps the last insert.
class MergeMap {
public:
    struct Merge {
        uint32_t rank;
        int32_t new_id;
    };
    // Sized for n pairs at a load of at most 3/4 (the table is read on the hot path, so smaller
    // beats emptier: fewer cache misses).
    void reserve(size_t n) {
        size_t cap = 16;
        while (3 * cap < 4 * n) cap <<= 1;
        slots_.assign(cap, Slot{});
        count_ = 0;
    }
    void insert(int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
        if (4 * (count_ + 1) > 3 * slots_.size()) grow();
        const uint64_t key = pack(a, b);
        size_t i = hash_u64(key) & (slots_.size() - 1);
        while (slots_[i].key != kEmptyKey && slots_[i].key != key)
            i = (i + 1) & (slots_.size() - 1);
        if (slots_[i].key == kEmptyKey) ++count_;
        slots_[i] = Slot{key, Merge{rank, new_id}};
    }
    void prefetch(int32_t a, int32_t b) const {
        if (!slots_.empty())
            __builtin_prefetch(&slots_[hash_u64(pack(a, b)) & (slots_.size() - 1)]);
    }
    const Merge* find(int32_t a, int32_t b) const {
        if (slots_.empty()) return nullptr;
        const uint64_t key = pack(a, b);
        size_t i = hash_u64(key) & (slots_.size() - 1);
        while (true) {
            const Slot& s = slots_[i];
            if (s.key == key) return &s.merge;
            if (s.key == kEmptyKey) return nullptr;
            i = (i + 1) & (slots_.size() - 1);
        }
    }
    size_t size() const { return count_; }

private:
    static constexpr uint64_t kEmptyKey = ~0ull;
    struct Slot {
        uint64_t key = kEmptyKey;
        Merge merge{0, 0};
    };
    static uint64_t pack(int32_t a, int32_t b) {
        return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    }
    void grow() {
        HugePageVector<Slot> old;
        old.swap(slots_);
        const size_t cap = old.empty() ? 16 : 2 * old.size();
        slots_.assign(cap, Slot{});
        for (const Slot& s : old) {
            if (s.key == kEmptyKey) continue;
            size_t i = hash_u64(s.key) & (cap - 1);
            while (slots_[i].key != kEmptyKey) i = (i + 1) & (cap - 1);
            slots_[i] = s;
        }
    }
    HugePageVector<Slot> slots_;
    size_t count_ = 0;
};

}  // namespace lathe
