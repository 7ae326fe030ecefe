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

namespace lathe {

// A bounded piece -> ids memo, owned by one thread. When full it is cleared (simple and, for the
// Zipfian word distribution of real text, almost as good as LRU).
class BpeCache {
public:
    explicit BpeCache(size_t max_entries = 1 << 16);
    // Appends the cached ids of `key` to `out` and returns true, or returns false.
    bool lookup(std::string_view key, uint64_t hash, std::vector<int32_t>& out) const;
    void insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t count);

private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t key_offset = 0;
        uint32_t key_len = 0;
        uint32_t ids_offset = 0;
        uint32_t ids_len = 0;
        bool used = false;
    };
    void clear();
    size_t max_entries_;
    size_t count_ = 0;
    std::vector<Slot> slots_;
    std::string keys_;
    std::vector<int32_t> ids_;
};

// Work buffers for merging one word, reused across calls by one thread.
struct BpeWork {
    std::vector<int32_t> symbols;   // symbol ids, left to right
    std::vector<uint32_t> ranks;    // ranks[i]: merge rank of (symbols[i], symbols[i+1])
    std::vector<int32_t> new_ids;   // new_ids[i]: id that pair merges into
    std::string buffer;             // a character with prefix/suffix, a <0xHH> name
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

    std::optional<int32_t> token_to_id(std::string_view token) const { return vocab_.find(token); }
    // The token of `id`, or nullptr.
    const std::string* id_to_token(int32_t id) const {
        if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
        return id_to_token_[static_cast<size_t>(id)].has_value()
                   ? &*id_to_token_[static_cast<size_t>(id)]
                   : nullptr;
    }
    // HF Model::get_vocab_size for BPE: the number of vocabulary entries.
    int32_t vocab_entries() const { return static_cast<int32_t>(vocab_.size()); }
    // Largest id in the vocabulary, -1 when empty.
    int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

private:
    BpeModel() = default;
    // Steps 2 and 3 above, uncached.
    Status merge_word(std::string_view piece, BpeWork& work, std::vector<int32_t>& ids) const;
    void merge_short(BpeWork& work) const;
    void merge_long(BpeWork& work) const;

    StringIdMap vocab_;
    std::vector<std::optional<std::string>> id_to_token_;
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
};

}  // namespace lathe
