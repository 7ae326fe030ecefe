#pragma once
// Added tokens ("added_tokens" of tokenizer.json): ids, the special set, and the matcher that cuts
// them out of text before the model sees it (internal to src/tokenizer). Mirrors HF
// tokenizer/added_vocabulary.rs:
//   - ids are assigned as HF assigns them on load, not read from the file: a content already in
//     the model's vocabulary (or added before) keeps that id, a new one gets the next free id
//     starting at the model's vocabulary size (the file's "id" only agrees when it is consistent);
//   - tokens with normalized=false are matched in the raw text; those with normalized=true are
//     matched, in their normalized form, inside the normalized text of the pieces between the
//     first kind;
//   - matching is leftmost-longest over non-overlapping matches; single_word rejects a match
//     touching a word character (Rust regex \w) on either side; lstrip/rstrip extend the match
//     over adjacent White_Space (lstrip never reaching back into the previous match).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/hash_tables.h"

namespace lathe {

struct AddedToken {
    std::string content;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = true;
    bool special = false;
};

// A piece of text after added-token matching: [begin, end) and the added token's id, or -1 for
// text that goes on to the normalizer/pre-tokenizer.
struct AddedSplit {
    uint32_t begin;
    uint32_t end;
    int32_t id;
};

// Leftmost-longest multi-pattern matcher over bytes (a trie; patterns are valid UTF-8 so matches
// fall on character boundaries).
class AddedTokenTrie {
public:
    void add(std::string_view pattern, int32_t value);
    bool empty() const { return nodes_.size() <= 1; }
    // The longest pattern starting at text[pos]: its length, and its value in *value; 0 if none.
    size_t longest_at(std::string_view text, size_t pos, int32_t* value) const;
    // Whether some pattern starts with byte b (a fast filter before longest_at).
    bool may_start(uint8_t b) const { return first_byte_[b]; }

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
        int32_t value = -1;                                 // -1: no pattern ends here
    };
    int32_t child(int32_t node, uint8_t b) const;
    std::vector<Node> nodes_{Node{}};
    bool first_byte_[256] = {};
};

class AddedVocabulary {
public:
    // Registers tokens in file order, as HF's add_tokens does. `model_lookup(content)` gives the
    // model's id of a string; `model_vocab_size` is HF's Model::get_vocab_size. `normalize(text)`
    // gives the normalized form used to match tokens with normalized=true (identity when the
    // tokenizer has no normalizer).
    template <typename ModelLookup, typename Normalize>
    void add_tokens(const std::vector<AddedToken>& tokens, ModelLookup model_lookup,
                    int32_t model_vocab_size, Normalize normalize);

    // Splits `text` on the tokens with normalized=false (normalized=false) or on the normalized
    // forms of the tokens with normalized=true. Appends to `out`; covers all of `text` (splits
    // may be empty; callers drop those).
    void split(std::string_view text, bool normalized, std::vector<AddedSplit>& out) const;

    bool has_raw_tokens() const { return !raw_trie_.empty(); }
    bool has_normalized_tokens() const { return !normalized_trie_.empty(); }

    std::optional<int32_t> token_to_id(std::string_view content) const {
        return ids_.find(content);
    }
    // The token's text for decoding (HF simple_id_to_token: the normalized form when it differs
    // from the content), or nullptr when `id` is not an added token.
    const std::string* decode_form(int32_t id) const;
    const AddedToken* token(int32_t id) const;
    // HF is_special_token: whether the string is the content of a special added token.
    bool is_special_string(std::string_view s) const { return special_set_.find(s).has_value(); }
    int32_t max_id() const { return max_id_; }

private:
    void find_matches(std::string_view text, const AddedTokenTrie& trie,
                      std::vector<AddedSplit>& out) const;

    struct Entry {
        AddedToken token;
        std::optional<std::string> normalized_form;
    };
    std::unordered_map<int32_t, Entry> entries_;  // id -> token
    StringIdMap ids_;                             // content -> id
    StringIdMap special_set_;                     // contents of special tokens
    AddedTokenTrie raw_trie_;
    AddedTokenTrie normalized_trie_;
    int32_t max_id_ = -1;
};

// ---- template implementation ----

template <typename ModelLookup, typename Normalize>
void AddedVocabulary::add_tokens(const std::vector<AddedToken>& tokens, ModelLookup model_lookup,
                                 int32_t model_vocab_size, Normalize normalize) {
    int32_t next_id = model_vocab_size;
    if (max_id_ >= 0 && (max_id_ >= model_vocab_size || model_vocab_size == 0))
        next_id = max_id_ + 1;
    for (const AddedToken& t : tokens) {
        if (t.content.empty()) continue;
        std::optional<int32_t> id = ids_.find(t.content);
        if (!id) id = model_lookup(t.content);
        const int32_t new_id = id ? *id : next_id++;
        Entry entry{t, std::nullopt};
        if (t.normalized) {
            std::string n = normalize(t.content);
            if (n != t.content) entry.normalized_form = std::move(n);
        }
        ids_.insert(t.content, new_id);
        if (t.special) special_set_.insert(t.content, new_id);
        entries_[new_id] = std::move(entry);
        if (new_id > max_id_) max_id_ = new_id;
    }
    // Rebuild both tries from every registered token, in id order (deterministic).
    raw_trie_ = AddedTokenTrie();
    normalized_trie_ = AddedTokenTrie();
    std::vector<int32_t> ids;
    for (const auto& kv : entries_) ids.push_back(kv.first);
    std::sort(ids.begin(), ids.end());
    for (int32_t id : ids) {
        const Entry& e = entries_.at(id);
        if (e.token.normalized) {
            normalized_trie_.add(e.normalized_form ? *e.normalized_form : e.token.content, id);
        } else {
            raw_trie_.add(e.token.content, id);
        }
    }
}

}  // namespace lathe
