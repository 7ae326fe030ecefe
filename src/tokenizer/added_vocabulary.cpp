#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace lathe {

namespace {

// Rust regex's Unicode \w: Alphabetic, M, Nd, Pc, Join_Control (HF matches single_word tokens
// with ^\w and \w$ from the `regex` crate).
bool is_rust_word_char(char32_t c) {
    if (c < 0x80) {
        return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
    }
    if (c == 0x200C || c == 0x200D) return true;
    return utf8::is_alphabetic(c) || utf8::is_mark(c) || utf8::is_numeric_decimal(c) ||
           utf8::is_connector_punctuation(c);
}

// The first character of s (non-empty, valid UTF-8).
char32_t first_char(std::string_view s) {
    int len;
    return utf8::decode(s, 0, &len);
}

// The last character of s (non-empty, valid UTF-8).
char32_t last_char(std::string_view s) {
    size_t i = s.size() - 1;
    while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
    int len;
    return utf8::decode(s, i, &len);
}

}  // namespace

void AddedTokenTrie::add(std::string_view pattern, int32_t value) {
    if (pattern.empty()) return;  // HF cannot match an empty token either
    int32_t node = 0;
    for (char ch : pattern) {
        const auto b = static_cast<uint8_t>(ch);
        int32_t next = child(node, b);
        if (next < 0) {
            next = static_cast<int32_t>(nodes_.size());
            nodes_.emplace_back();
            auto& children = nodes_[static_cast<size_t>(node)].children;
            auto it = std::lower_bound(children.begin(), children.end(), b,
                                       [](const auto& c, uint8_t x) { return c.first < x; });
            children.insert(it, {b, next});
        }
        node = next;
    }
    nodes_[static_cast<size_t>(node)].value = value;
    first_byte_[static_cast<uint8_t>(pattern[0])] = true;
}

int32_t AddedTokenTrie::child(int32_t node, uint8_t b) const {
    const auto& children = nodes_[static_cast<size_t>(node)].children;
    for (const auto& c : children) {
        if (c.first == b) return c.second;
        if (c.first > b) break;
    }
    return -1;
}

size_t AddedTokenTrie::longest_at(std::string_view text, size_t pos, int32_t* value) const {
    int32_t node = 0;
    size_t best = 0;
    for (size_t i = pos; i < text.size(); ++i) {
        node = child(node, static_cast<uint8_t>(text[i]));
        if (node < 0) break;
        const int32_t v = nodes_[static_cast<size_t>(node)].value;
        if (v >= 0) {
            best = i + 1 - pos;
            *value = v;
        }
    }
    return best;
}

const std::string* AddedVocabulary::decode_form(int32_t id) const {
    auto it = entries_.find(id);
    if (it == entries_.end()) return nullptr;
    return it->second.normalized_form ? &*it->second.normalized_form : &it->second.token.content;
}

const AddedToken* AddedVocabulary::token(int32_t id) const {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : &it->second.token;
}

void AddedVocabulary::split(std::string_view text, bool normalized,
                            std::vector<AddedSplit>& out) const {
    const AddedTokenTrie& trie = normalized ? normalized_trie_ : raw_trie_;
    if (trie.empty() || text.empty()) {
        out.push_back(AddedSplit{0, static_cast<uint32_t>(text.size()), -1});
        return;
    }
    find_matches(text, trie, out);
}

void AddedVocabulary::find_matches(std::string_view text, const AddedTokenTrie& trie,
                                   std::vector<AddedSplit>& out) const {
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < text.size()) {
        if (!trie.may_start(static_cast<uint8_t>(text[pos]))) {
            ++pos;
            continue;
        }
        int32_t id = -1;
        const size_t len = trie.longest_at(text, pos, &id);
        if (len == 0) {
            ++pos;
            continue;
        }
        size_t start = pos;
        size_t stop = pos + len;
        pos = stop;  // non-overlapping: the next search starts after this match
        const AddedToken& t = entries_.at(id).token;
        if (t.single_word) {
            const bool start_space =
                start == 0 || !is_rust_word_char(last_char(text.substr(0, start)));
            const bool stop_space =
                stop == text.size() || !is_rust_word_char(first_char(text.substr(stop)));
            if (!start_space || !stop_space) continue;
        }
        if (t.lstrip) {
            // Start of the White_Space run that ends at `start`, never before the previous split.
            size_t s = start;
            while (s > 0) {
                size_t b = s - 1;
                while (b > 0 && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
                int clen;
                if (!utf8::is_whitespace(utf8::decode(text, b, &clen))) break;
                s = b;
            }
            start = std::max(s, start_offset);
        }
        if (t.rstrip) {
            while (stop < text.size()) {
                int clen;
                if (!utf8::is_whitespace(utf8::decode(text, stop, &clen))) break;
                stop += static_cast<size_t>(clen);
            }
        }
        if (start_offset < start) {
            out.push_back(
                AddedSplit{static_cast<uint32_t>(start_offset), static_cast<uint32_t>(start), -1});
        }
        out.push_back(AddedSplit{static_cast<uint32_t>(start), static_cast<uint32_t>(stop), id});
        start_offset = stop;
    }
    if (start_offset != text.size()) {
        out.push_back(AddedSplit{static_cast<uint32_t>(start_offset),
                                 static_cast<uint32_t>(text.size()), -1});
    }
}

}  // namespace lathe
