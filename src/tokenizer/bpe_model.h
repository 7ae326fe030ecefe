#pragma once
// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}); internal to src/tokenizer.
//
// encode one pre-tokenized piece, as HF models/bpe (BPE::tokenize) does:
//   1. ignore_merges and the whole piece is in the vocabulary -> that one id;
//   2. otherwise one symbol per character (continuing_subword_prefix on every character but the
//      first, end_of_word_suffix on the last); a character missing from the vocabulary becomes its
//      <0xHH> byte tokens (byte_fallback, when all exist), else unk_token (runs fused into one
//      when fuse_unk), else it is dropped;
//   3. merges: repeatedly merge the adjacent pair with the lowest merge rank, the leftmost one
//      among equals, until no adjacent pair has a merge.
// Results are memoized per thread in a bounded BpeCache (pure function of the piece).
// Only dropout null or 0 is supported (dropout makes HF's output random).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/hash_tables.h"
#include "tokenizer/json_node.h"
#include "tokenizer/pre_tokenizer.h"

namespace lathe {

// A bounded piece -> ids memo, owned by one thread: a direct-mapped table of 64-byte slots (one
// cache line each) holding pieces of up to kMaxKeyBytes bytes and their ids (up to kMaxIds) inline.
// A new piece overwrites whatever its slot held, so memory stays fixed and a lookup costs one
// cache line; for the Zipfian word distribution of real text the hit rate stays high.
class BpeCache {
public:
    static constexpr size_t kMaxKeyBytes = 32;
    static constexpr size_t kMaxIds = 7;

    // slots: rounded up to a power of two.
    explicit BpeCache(size_t slots = 1 << 15);

    // A piece prepared for lookup: its bytes zero-padded to kMaxKeyBytes, and its hash.
    struct Key {
        uint64_t words[kMaxKeyBytes / 8];
        uint64_t hash;
        uint8_t len;
    };
    // Fills `key` for `piece` (piece.size() <= kMaxKeyBytes).
    static void make_key(std::string_view piece, Key& key);

    // Starts loading the slot of `key` into the CPU cache (lookups are memory-latency bound, so
    // the keys of a batch of pieces are prefetched before they are looked up).
    void prefetch(const Key& key) const { __builtin_prefetch(&slots_[key.hash & mask_]); }

    // Appends the cached ids of `key` to `out` and returns true, or returns false.
    bool lookup(const Key& key, std::vector<int32_t>& out) const {
        const Slot& s = slots_[key.hash & mask_];
        if (s.len != key.len || s.words[0] != key.words[0] || s.words[1] != key.words[1] ||
            s.words[2] != key.words[2] || s.words[3] != key.words[3]) {
            return false;
        }
        for (uint8_t i = 0; i < s.n_ids; ++i) out.push_back(s.ids[i]);
        return true;
    }
    // Stores ids for key (count in 1..kMaxIds; other counts are not cached).
    void insert(const Key& key, const int32_t* ids, size_t count) {
        if (count == 0 || count > kMaxIds) return;
        Slot& s = slots_[key.hash & mask_];
        for (size_t i = 0; i < 4; ++i) s.words[i] = key.words[i];
        s.len = key.len;
        s.n_ids = static_cast<uint8_t>(count);
        for (size_t i = 0; i < count; ++i) s.ids[i] = ids[i];
    }

    // Pieces longer than kMaxKeyBytes (up to kMaxLongKeyBytes: most words of scripts whose
    // characters take 2 or 3 bytes, long numbers, runs of spaces) go to a second direct-mapped
    // table whose keys and ids live in an arena; when the arena is full, that table starts over.
    static constexpr size_t kMaxLongKeyBytes = 256;
    bool lookup_long(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const;
    void insert_long(std::string_view piece, uint64_t hash, const int32_t* ids, size_t count);

private:
    struct LongSlot {
        uint64_t hash = 0;
        uint32_t offset = 0;   // key bytes, then the ids, in long_arena_
        uint16_t key_len = 0;  // 0: empty
        uint16_t n_ids = 0;
    };
    static constexpr size_t kLongSlots = 1 << 13;
    static constexpr size_t kLongArenaBytes = size_t{4} << 20;
    std::vector<LongSlot> long_slots_ = std::vector<LongSlot>(kLongSlots);
    std::string long_arena_;

    struct alignas(64) Slot {
        uint64_t words[kMaxKeyBytes / 8] = {0, 0, 0, 0};
        int32_t ids[kMaxIds] = {};
        uint8_t len = 0;  // 0: empty (pieces are never empty)
        uint8_t n_ids = 0;
    };
    static_assert(sizeof(Slot) == 64);
    HugePageVector<Slot> slots_;
    size_t mask_;
};

// Work buffers for merging one word, reused across calls by one thread.
struct BpeWork {
    std::vector<int32_t> symbols;  // symbol ids, left to right
    std::vector<uint32_t> ranks;   // ranks[i]: merge rank of (symbols[i], symbols[i+1])
    std::vector<int32_t> new_ids;  // new_ids[i]: id that pair merges into
    std::string buffer;            // a character with prefix/suffix, a <0xHH> name
    // Linked-list form for long words (HF's Word::merge_all with a binary heap).
    struct Node {
        int32_t id;
        int32_t prev;
        int32_t next;
        bool alive;
    };
    std::vector<Node> nodes;
    struct HeapEntry {
        uint32_t rank;
        uint32_t pos;
        int32_t new_id;
    };
    std::vector<HeapEntry> heap;
    std::vector<BpeCache::Key> keys;  // cache keys of a batch of pieces
};

class BpeModel {
public:
    // Builds the model from the "model" node. Errors: missing vocab/merges, a merge whose parts or
    // result are not in the vocabulary (naming the merge and its index), a malformed "a b" merge,
    // dropout other than null/0.
    static Result<std::unique_ptr<BpeModel>> from_node(const JsonNode& node);

    // Appends the ids of one non-empty piece to `ids`. Error: unk_token needed but absent from
    // the vocabulary (HF's UnkTokenOutOfVocabulary).
    Status tokenize(std::string_view piece, BpeCache& cache, BpeWork& work,
                    std::vector<int32_t>& ids) const;
    // Appends the ids of every piece of `pieces`, in order (the same as tokenize() on each, with
    // the cache lookups of a batch of pieces overlapped).
    Status tokenize_pieces(const PieceList& pieces, BpeCache& cache, BpeWork& work,
                           std::vector<int32_t>& ids) const;

    std::optional<int32_t> token_to_id(std::string_view token) const { return vocab_.find(token); }
    // The token of `id`, or nullopt. The view lives as long as the model.
    std::optional<std::string_view> id_to_token(int32_t id) const;
    // HF Model::get_vocab_size for BPE: the number of vocabulary entries.
    int32_t vocab_entries() const { return static_cast<int32_t>(vocab_.size()); }
    // Largest id in the vocabulary, -1 when empty.
    int32_t max_id() const { return max_id_; }

private:
    BpeModel() = default;
    // Fills dense_ids_, sparse_ids_ and max_id_ from vocab_.
    void build_id_index();
    // Steps 2 and 3 above, uncached.
    Status merge_word(std::string_view piece, BpeWork& work, std::vector<int32_t>& ids) const;
    // A piece longer than BpeCache::kMaxKeyBytes, through the memo's long table.
    Status tokenize_long(std::string_view piece, BpeCache& cache, BpeWork& work,
                         std::vector<int32_t>& ids) const;
    // Everything after a cache miss: ignore_merges' whole-piece lookup, else merge_word.
    Status tokenize_uncached(std::string_view piece, BpeWork& work,
                             std::vector<int32_t>& ids) const;
    // The vocabulary id of one character (UTF-8 `c`, no prefix/suffix), or nullopt.
    std::optional<int32_t> char_id(std::string_view c) const {
        const auto b0 = static_cast<uint8_t>(c[0]);
        if (c.size() == 1)
            return ascii_ids_[b0] >= 0 ? std::optional<int32_t>(ascii_ids_[b0]) : std::nullopt;
        if (c.size() == 2) {
            const size_t cp = (size_t(b0 & 0x1F) << 6) | (static_cast<uint8_t>(c[1]) & 0x3F);
            const int32_t id = two_byte_ids_[cp - 0x80];
            if (id >= 0) return id;
            if (id == kAbsent) return std::nullopt;
        }
        return vocab_.find(c);
    }
    void merge_short(BpeWork& work) const;
    void merge_long(BpeWork& work) const;

    StringIdMap vocab_;
    // id -> where its token's bytes are in vocab_'s arena (fixed once loading is done). Ids are
    // kept as HF keeps them, in a map: the ids below dense_ids_.size() (at most a small multiple
    // of the vocabulary size) in a table indexed by id, any larger ones (a file may give a token
    // any id up to 2^31 - 1) in sparse_ids_, sorted by id. Memory follows the number of tokens,
    // never the largest id.
    struct TokenRef {
        uint32_t offset = 0;
        uint32_t len = 0;
    };
    static constexpr uint32_t kNoToken = 0xFFFFFFFFu;
    std::vector<TokenRef> dense_ids_;
    struct SparseId {
        int32_t id;
        TokenRef ref;
    };
    std::vector<SparseId> sparse_ids_;
    int32_t max_id_ = -1;
    MergeMap merges_;
    std::optional<std::string> unk_token_;
    std::optional<int32_t> unk_id_;
    std::string continuing_subword_prefix_;
    std::string end_of_word_suffix_;
    bool has_prefix_ = false;
    bool has_suffix_ = false;
    bool fuse_unk_ = false;
    bool byte_fallback_ = false;
    bool ignore_merges_ = false;
    // byte_fallback ids of <0x00>..<0xFF>, -1 where absent.
    int32_t byte_ids_[256];
    // Ids of the one-character tokens U+0000..U+007F and U+0080..U+07FF (the whole byte-level
    // alphabet), so that a word's first symbols need no hash lookups; kAbsent where the
    // vocabulary has no such token.
    static constexpr int32_t kAbsent = -1;
    int32_t ascii_ids_[128];
    std::vector<int32_t> two_byte_ids_;
};

}  // namespace lathe
