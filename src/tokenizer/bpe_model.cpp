#include "tokenizer/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <thread>

#include "core/strings.h"
#include "tokenizer/utf8.h"

namespace lathe {

namespace {

constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();
// Words with more symbols than this merge through the linked list + heap (O(n log n)); shorter
// ones through a flat array scanned for the lowest rank (O(n^2), but faster for small n).
constexpr size_t kShortWordSymbols = 48;

}  // namespace

// ---------------------------------------------------------------------------------------------
// BpeCache

BpeCache::BpeCache(size_t slots) {
    size_t cap = 16;
    while (cap < slots) cap <<= 1;
    slots_.resize(cap);
    mask_ = cap - 1;
}

void BpeCache::make_key(std::string_view piece, Key& key) {
    key.words[0] = key.words[1] = key.words[2] = key.words[3] = 0;
    std::memcpy(key.words, piece.data(), piece.size());
    key.len = static_cast<uint8_t>(piece.size());
    uint64_t h = (key.words[0] ^ piece.size()) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 29) ^ key.words[1]) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 31) ^ key.words[2]) * 0x94D049BB133111EBull;
    h = (h ^ (h >> 29) ^ key.words[3]) * 0x9E3779B97F4A7C15ull;
    key.hash = h ^ (h >> 32);
}

bool BpeCache::lookup_long(std::string_view piece, uint64_t hash, std::vector<int32_t>& out) const {
    const LongSlot& s = long_slots_[hash & (kLongSlots - 1)];
    if (s.key_len != piece.size() || s.hash != hash ||
        std::memcmp(long_arena_.data() + s.offset, piece.data(), piece.size()) != 0) {
        return false;
    }
    const size_t at = out.size();
    out.resize(at + s.n_ids);
    std::memcpy(out.data() + at, long_arena_.data() + s.offset + s.key_len,
                s.n_ids * sizeof(int32_t));
    return true;
}

void BpeCache::insert_long(std::string_view piece, uint64_t hash, const int32_t* ids,
                           size_t count) {
    if (piece.empty() || piece.size() > kMaxLongKeyBytes || count > 0xFFFF) return;
    const size_t bytes = piece.size() + count * sizeof(int32_t);
    if (long_arena_.size() + bytes > kLongArenaBytes) {
        std::fill(long_slots_.begin(), long_slots_.end(), LongSlot{});
        long_arena_.clear();
    }
    LongSlot& s = long_slots_[hash & (kLongSlots - 1)];
    s.hash = hash;
    s.offset = static_cast<uint32_t>(long_arena_.size());
    s.key_len = static_cast<uint16_t>(piece.size());
    s.n_ids = static_cast<uint16_t>(count);
    long_arena_.append(piece);
    long_arena_.append(reinterpret_cast<const char*>(ids), count * sizeof(int32_t));
}

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

// Loading spreads merge resolution over threads only when there are many merges.
constexpr size_t kMergesPerLoadThread = 40000;
constexpr size_t kMaxLoadThreads = 8;

struct MergeText {
    std::string_view a, b;
    size_t index;  // position in the JSON array (for messages)
};

struct MergeError {
    std::string message;  // empty: no error
};

// Looks up the ids of a, b and the merged token of texts[lo, hi) into resolved[3r .. 3r+2], in
// batches whose hash-table lookups are prefetched together (otherwise each of the hundreds of
// thousands of lookups would wait on memory in turn). Stops at the first failure, recorded in
// `error`.
void resolve_merges(const StringIdMap& vocab, const std::vector<MergeText>& texts,
                    size_t prefix_len, size_t lo, size_t hi, std::vector<int32_t>& resolved,
                    MergeError& error) {
    constexpr size_t kBatch = 32;
    std::string merged;  // the merged strings of a batch, back to back
    std::array<size_t, kBatch + 1> merged_at{};
    std::array<uint64_t, 3 * kBatch> hashes{};
    for (size_t base = lo; base < hi; base += kBatch) {
        const size_t n = std::min(kBatch, hi - base);
        merged.clear();
        for (size_t i = 0; i < n; ++i) {
            const MergeText& t = texts[base + i];
            if (t.b.size() < prefix_len) {
                error.message =
                    fmt::format("merge {}: '{}' is shorter than continuing_subword_prefix", t.index,
                                escape_for_message(t.b));
                return;
            }
            merged_at[i] = merged.size();
            merged.append(t.a);
            merged.append(t.b.substr(prefix_len));
        }
        merged_at[n] = merged.size();
        auto part = [&](size_t i, size_t k) -> std::string_view {
            const MergeText& t = texts[base + i];
            if (k == 0) return t.a;
            if (k == 1) return t.b;
            return std::string_view(merged).substr(merged_at[i], merged_at[i + 1] - merged_at[i]);
        };
        for (size_t i = 0; i < n; ++i) {
            for (size_t k = 0; k < 3; ++k) {
                const std::string_view s = part(i, k);
                hashes[3 * i + k] = hash_bytes(s.data(), s.size());
                vocab.prefetch_slot(hashes[3 * i + k]);
            }
        }
        for (size_t j = 0; j < 3 * n; ++j) vocab.prefetch_key(hashes[j]);
        for (size_t i = 0; i < n; ++i) {
            for (size_t k = 0; k < 3; ++k) {
                const std::optional<int32_t> id = vocab.find(part(i, k), hashes[3 * i + k]);
                if (!id) {
                    const MergeText& t = texts[base + i];
                    error.message =
                        k < 2 ? fmt::format("merge {} ('{}' + '{}'): '{}' is not in the vocabulary",
                                            t.index, escape_for_message(t.a),
                                            escape_for_message(t.b), escape_for_message(part(i, k)))
                              : fmt::format(
                                    "merge {}: the merged token '{}' is not in the vocabulary",
                                    t.index, escape_for_message(part(i, k)));
                    return;
                }
                resolved[3 * (base + i) + k] = *id;
            }
        }
    }
}

}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::from_node(const JsonNode& node) {
    LATHE_RETURN_IF_ERROR(node.expect_object());
    std::unique_ptr<BpeModel> m(new BpeModel());

    if (std::optional<JsonNode> d = node.field("dropout"); d && !d->is_null()) {
        double p = 0;
        if (d->element().get_double().get(p) != simdjson::SUCCESS) {
            return d->error(fmt::format("expected a number or null, got {}", d->type_name()));
        }
        if (p != 0.0) {
            return Status(StatusCode::kUnimplemented,
                          fmt::format("{}: {}: BPE dropout {} is not supported (its output is "
                                      "random); set it to null",
                                      node.source(), d->path(), p));
        }
    }
    LATHE_ASSIGN_OR_RETURN(std::optional<std::string_view> unk,
                           node.get_optional_string("unk_token"));
    if (unk) m->unk_token_ = std::string(*unk);
    LATHE_ASSIGN_OR_RETURN(std::optional<std::string_view> prefix,
                           node.get_optional_string("continuing_subword_prefix"));
    if (prefix) {
        m->has_prefix_ = true;
        m->continuing_subword_prefix_ = std::string(*prefix);
    }
    LATHE_ASSIGN_OR_RETURN(std::optional<std::string_view> suffix,
                           node.get_optional_string("end_of_word_suffix"));
    if (suffix) {
        m->has_suffix_ = true;
        m->end_of_word_suffix_ = std::string(*suffix);
    }
    LATHE_ASSIGN_OR_RETURN(m->fuse_unk_, node.get_bool("fuse_unk", false));
    LATHE_ASSIGN_OR_RETURN(m->byte_fallback_, node.get_bool("byte_fallback", false));
    LATHE_ASSIGN_OR_RETURN(m->ignore_merges_, node.get_bool("ignore_merges", false));

    // Vocabulary.
    LATHE_ASSIGN_OR_RETURN(JsonNode vocab_node, node.required("vocab"));
    simdjson::dom::object vocab_obj;
    if (vocab_node.element().get_object().get(vocab_obj) != simdjson::SUCCESS) {
        return vocab_node.error(
            fmt::format("expected an object of token: id, got {}", vocab_node.type_name()));
    }
    m->vocab_.reserve(vocab_obj.size());
    for (auto [key, value] : vocab_obj) {
        int64_t id = 0;
        if (value.get_int64().get(id) != simdjson::SUCCESS || id < 0 ||
            id > std::numeric_limits<uint32_t>::max()) {
            // HF reads ids as u32 and refuses the file otherwise.
            return vocab_node.error(fmt::format(
                "the id of token '{}' is {}; Hugging Face tokenizers refuses it too (ids are "
                "integers from 0 to 2^32 - 1; lathe's from 0 to 2^31 - 1)",
                escape_for_message(key), simdjson::minify(value)));
        }
        if (id > std::numeric_limits<int32_t>::max()) {
            return vocab_node.error(fmt::format(
                "the id of token '{}' is {}; lathe keeps token ids as 32-bit signed integers "
                "(0 to 2^31 - 1 = 2147483647), so it cannot use this file (Hugging Face "
                "tokenizers reads ids up to 2^32 - 1)",
                escape_for_message(key), id));
        }
        m->vocab_.insert(key, static_cast<int32_t>(id));
    }
    m->build_id_index();
    if (m->unk_token_) m->unk_id_ = m->vocab_.find(*m->unk_token_);
    for (int b = 0; b < 256; ++b) {
        const std::optional<int32_t> id = m->vocab_.find(fmt::format("<0x{:02X}>", b));
        m->byte_ids_[b] = id ? *id : -1;
    }
    for (char32_t cp = 0; cp < 0x80; ++cp) {
        const std::optional<int32_t> id = m->vocab_.find(utf8::encode(cp));
        m->ascii_ids_[cp] = id ? *id : kAbsent;
    }
    m->two_byte_ids_.resize(0x800 - 0x80);
    for (char32_t cp = 0x80; cp < 0x800; ++cp) {
        const std::optional<int32_t> id = m->vocab_.find(utf8::encode(cp));
        m->two_byte_ids_[cp - 0x80] = id ? *id : kAbsent;
    }
    // An empty prefix or suffix changes nothing (gpt2.json carries "" for both).
    if (m->continuing_subword_prefix_.empty()) m->has_prefix_ = false;
    if (m->end_of_word_suffix_.empty()) m->has_suffix_ = false;

    // Merges: ["a b", ...] or [["a", "b"], ...].
    LATHE_ASSIGN_OR_RETURN(JsonNode merges_node, node.required("merges"));
    simdjson::dom::array merges_arr;
    if (merges_node.element().get_array().get(merges_arr) != simdjson::SUCCESS) {
        return merges_node.error(fmt::format("expected an array, got {}", merges_node.type_name()));
    }
    // First every merge as two strings (checking the form), then their ids.
    std::vector<MergeText> texts;
    texts.reserve(merges_arr.size());
    size_t index = 0;
    for (simdjson::dom::element e : merges_arr) {
        std::string_view a, b;
        std::string_view line;
        if (e.get_string().get(line) == simdjson::SUCCESS) {
            if (line.starts_with("#version")) {
                ++index;
                continue;
            }
            const size_t sp = line.find(' ');
            if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) {
                return merges_node.error(
                    fmt::format("merge {} ('{}') is not two tokens separated by one space", index,
                                escape_for_message(line)));
            }
            a = line.substr(0, sp);
            b = line.substr(sp + 1);
        } else {
            simdjson::dom::array pair;
            if (e.get_array().get(pair) != simdjson::SUCCESS || pair.size() != 2 ||
                pair.at(0).get_string().get(a) != simdjson::SUCCESS ||
                pair.at(1).get_string().get(b) != simdjson::SUCCESS) {
                return merges_node.error(
                    fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", index));
            }
        }
        texts.push_back(MergeText{a, b, index});
        ++index;
    }
    // Resolve the ids of every merge (read-only lookups, so several threads share the work),
    // then fill the merge map in rank order.
    const size_t prefix_len = m->continuing_subword_prefix_.size();
    std::vector<int32_t> resolved(3 * texts.size());
    const size_t threads = std::clamp<size_t>(
        texts.size() / kMergesPerLoadThread, 1,
        std::min<size_t>(kMaxLoadThreads, std::max(1u, std::thread::hardware_concurrency())));
    std::vector<MergeError> errors(threads);
    std::vector<std::thread> workers;
    const size_t per = (texts.size() + threads - 1) / threads;
    for (size_t t = 0; t < threads; ++t) {
        const size_t lo = std::min(texts.size(), t * per);
        const size_t hi = std::min(texts.size(), lo + per);
        auto job = [&, lo, hi, t] {
            resolve_merges(m->vocab_, texts, prefix_len, lo, hi, resolved, errors[t]);
        };
        if (t + 1 == threads) {
            job();  // the calling thread takes the last range
        } else {
            workers.emplace_back(job);
        }
    }
    for (std::thread& w : workers) w.join();
    for (const MergeError& e : errors) {  // ranges are in order: the first error is the earliest
        if (!e.message.empty()) return merges_node.error(e.message);
    }
    m->merges_.reserve(texts.size());
    constexpr size_t kAhead = 16;
    for (size_t r = 0; r < texts.size(); ++r) {
        if (r + kAhead < texts.size()) {
            m->merges_.prefetch(resolved[3 * (r + kAhead)], resolved[3 * (r + kAhead) + 1]);
        }
        m->merges_.insert(resolved[3 * r], resolved[3 * r + 1], static_cast<uint32_t>(r),
                          resolved[3 * r + 2]);
    }
    return m;
}

void BpeModel::build_id_index() {
    // Ids below this bound are indexed directly: a table of at most about twice the entries, so
    // that a vocabulary with gaps (or a few tokens with very large ids) costs memory by its number
    // of tokens, not by its largest id.
    const size_t entries = vocab_.size();
    const size_t dense_bound = 2 * entries + 1024;
    int64_t max_id = -1;
    size_t dense_size = 0;
    vocab_.for_each([&](std::string_view, int32_t id) {
        max_id = std::max<int64_t>(max_id, id);
        if (static_cast<size_t>(id) < dense_bound)
            dense_size = std::max(dense_size, size_t(id) + 1);
    });
    max_id_ = static_cast<int32_t>(max_id);
    dense_ids_.assign(dense_size, TokenRef{0, kNoToken});
    sparse_ids_.clear();
    // Two tokens sharing an id: keep the lexicographically smaller (deterministic; HF's choice
    // depends on hash order).
    auto smaller = [&](std::string_view key, const TokenRef& ref) {
        return ref.len == kNoToken || key < vocab_.key_at(ref.offset, ref.len);
    };
    vocab_.for_each_ref([&](std::string_view key, int32_t id, uint32_t offset) {
        const TokenRef here{offset, static_cast<uint32_t>(key.size())};
        if (static_cast<size_t>(id) < dense_ids_.size()) {
            TokenRef& ref = dense_ids_[static_cast<size_t>(id)];
            if (smaller(key, ref)) ref = here;
        } else {
            sparse_ids_.push_back(SparseId{id, here});
        }
    });
    std::sort(sparse_ids_.begin(), sparse_ids_.end(), [&](const SparseId& x, const SparseId& y) {
        if (x.id != y.id) return x.id < y.id;
        return vocab_.key_at(x.ref.offset, x.ref.len) < vocab_.key_at(y.ref.offset, y.ref.len);
    });
    sparse_ids_.erase(
        std::unique(sparse_ids_.begin(), sparse_ids_.end(),
                    [](const SparseId& x, const SparseId& y) { return x.id == y.id; }),
        sparse_ids_.end());
    sparse_ids_.shrink_to_fit();
}

std::optional<std::string_view> BpeModel::id_to_token(int32_t id) const {
    if (id < 0) return std::nullopt;
    if (static_cast<size_t>(id) < dense_ids_.size()) {
        const TokenRef r = dense_ids_[static_cast<size_t>(id)];
        if (r.len == kNoToken) return std::nullopt;
        return vocab_.key_at(r.offset, r.len);
    }
    auto it = std::lower_bound(sparse_ids_.begin(), sparse_ids_.end(), id,
                               [](const SparseId& s, int32_t x) { return s.id < x; });
    if (it == sparse_ids_.end() || it->id != id) return std::nullopt;
    return vocab_.key_at(it->ref.offset, it->ref.len);
}

// ---------------------------------------------------------------------------------------------
// Encoding

Status BpeModel::tokenize(std::string_view piece, BpeCache& cache, BpeWork& work,
                          std::vector<int32_t>& ids) const {
    if (piece.empty()) return ok_status();
    if (piece.size() > BpeCache::kMaxKeyBytes) return tokenize_long(piece, cache, work, ids);
    BpeCache::Key key;
    BpeCache::make_key(piece, key);
    if (cache.lookup(key, ids)) return ok_status();
    const size_t start = ids.size();
    LATHE_RETURN_IF_ERROR(tokenize_uncached(piece, work, ids));
    cache.insert(key, ids.data() + start, ids.size() - start);
    return ok_status();
}

Status BpeModel::tokenize_pieces(const PieceList& pieces, BpeCache& cache, BpeWork& work,
                                 std::vector<int32_t>& ids) const {
    // In chunks: make the keys and prefetch their slots, then look them up.
    constexpr size_t kChunk = 32;
    work.keys.resize(kChunk);
    for (size_t base = 0; base < pieces.size(); base += kChunk) {
        const size_t n = std::min(kChunk, pieces.size() - base);
        for (size_t i = 0; i < n; ++i) {
            const std::string_view piece = pieces.view(base + i);
            BpeCache::Key& key = work.keys[i];
            if (piece.size() <= BpeCache::kMaxKeyBytes) {
                BpeCache::make_key(piece, key);
                cache.prefetch(key);
            } else {
                key.len = 0;  // not cacheable
            }
        }
        for (size_t i = 0; i < n; ++i) {
            const std::string_view piece = pieces.view(base + i);
            const BpeCache::Key& key = work.keys[i];
            if (key.len == 0) {
                LATHE_RETURN_IF_ERROR(tokenize_long(piece, cache, work, ids));
                continue;
            }
            if (cache.lookup(key, ids)) continue;
            const size_t start = ids.size();
            LATHE_RETURN_IF_ERROR(tokenize_uncached(piece, work, ids));
            cache.insert(key, ids.data() + start, ids.size() - start);
        }
    }
    return ok_status();
}

Status BpeModel::tokenize_long(std::string_view piece, BpeCache& cache, BpeWork& work,
                               std::vector<int32_t>& ids) const {
    if (piece.size() > BpeCache::kMaxLongKeyBytes) return tokenize_uncached(piece, work, ids);
    const uint64_t h = hash_bytes(piece.data(), piece.size());
    if (cache.lookup_long(piece, h, ids)) return ok_status();
    const size_t start = ids.size();
    LATHE_RETURN_IF_ERROR(tokenize_uncached(piece, work, ids));
    cache.insert_long(piece, h, ids.data() + start, ids.size() - start);
    return ok_status();
}

Status BpeModel::tokenize_uncached(std::string_view piece, BpeWork& work,
                                   std::vector<int32_t>& ids) const {
    if (ignore_merges_) {
        if (std::optional<int32_t> id = vocab_.find(piece)) {
            ids.push_back(*id);
            return ok_status();
        }
    }
    return merge_word(piece, work, ids);
}

Status BpeModel::merge_word(std::string_view piece, BpeWork& work,
                            std::vector<int32_t>& ids) const {
    std::vector<int32_t>& symbols = work.symbols;
    symbols.clear();
    bool unk_pending = false;
    size_t i = 0;
    while (i < piece.size()) {
        const size_t len = static_cast<size_t>(utf8::char_len(static_cast<uint8_t>(piece[i])));
        const bool is_first = i == 0;
        const bool is_last = i + len >= piece.size();
        std::string_view s = piece.substr(i, len);
        i += len;
        if ((has_prefix_ && !is_first) || (has_suffix_ && is_last)) {
            work.buffer.clear();
            if (has_prefix_ && !is_first) work.buffer.append(continuing_subword_prefix_);
            work.buffer.append(s);
            if (has_suffix_ && is_last) work.buffer.append(end_of_word_suffix_);
            s = work.buffer;
        }
        const bool plain = s.data() != work.buffer.data();
        if (std::optional<int32_t> id = plain ? char_id(s) : vocab_.find(s)) {
            if (unk_pending) {
                symbols.push_back(*unk_id_);
                unk_pending = false;
            }
            symbols.push_back(*id);
            continue;
        }
        if (byte_fallback_) {
            bool all = true;
            for (char c : s) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
            if (all) {
                // HF adds the byte tokens without flushing a pending unk first; so do we.
                for (char c : s) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
                continue;
            }
        }
        if (unk_token_) {
            if (!unk_id_) {
                return invalid_argument_error(
                    "the BPE unk_token '{}' is not in the vocabulary, and the text needs it",
                    escape_for_message(*unk_token_));
            }
            if (unk_pending && !fuse_unk_) symbols.push_back(*unk_id_);
            unk_pending = true;
        }
    }
    if (unk_pending) symbols.push_back(*unk_id_);

    if (symbols.size() > kShortWordSymbols) {
        merge_long(work);
    } else {
        merge_short(work);
    }
    ids.insert(ids.end(), symbols.begin(), symbols.end());
    return ok_status();
}

void BpeModel::merge_short(BpeWork& work) const {
    std::vector<int32_t>& sym = work.symbols;
    size_t n = sym.size();
    if (n < 2) return;
    work.ranks.resize(n);
    work.new_ids.resize(n);
    uint32_t* ranks = work.ranks.data();
    int32_t* new_ids = work.new_ids.data();
    auto set_pair = [&](size_t i) {
        const MergeMap::Merge* m = merges_.find(sym[i], sym[i + 1]);
        ranks[i] = m ? m->rank : kNoMerge;
        new_ids[i] = m ? m->new_id : -1;
    };
    for (size_t i = 0; i + 1 < n; ++i) set_pair(i);
    while (n > 1) {
        size_t best = 0;
        uint32_t best_rank = ranks[0];
        for (size_t i = 1; i + 1 < n; ++i) {
            if (ranks[i] < best_rank) {
                best_rank = ranks[i];
                best = i;
            }
        }
        if (best_rank == kNoMerge) break;
        sym[best] = new_ids[best];
        // Remove symbol best+1 and its pair entry.
        for (size_t j = best + 1; j + 1 < n; ++j) {
            sym[j] = sym[j + 1];
            ranks[j] = ranks[j + 1];
            new_ids[j] = new_ids[j + 1];
        }
        --n;
        if (best + 1 < n) set_pair(best);
        if (best > 0) set_pair(best - 1);
    }
    sym.resize(n);
}

void BpeModel::merge_long(BpeWork& work) const {
    std::vector<int32_t>& sym = work.symbols;
    const size_t n = sym.size();
    auto& nodes = work.nodes;
    nodes.resize(n);
    for (size_t i = 0; i < n; ++i) {
        nodes[i] = BpeWork::Node{sym[i], static_cast<int32_t>(i) - 1,
                                 i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
    }
    auto& heap = work.heap;
    heap.clear();
    // Min-heap on (rank, pos): the lowest rank first, the leftmost among equal ranks.
    auto later = [](const BpeWork::HeapEntry& x, const BpeWork::HeapEntry& y) {
        return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
    };
    auto push = [&](uint32_t pos) {
        const int32_t next = nodes[pos].next;
        const MergeMap::Merge* m = merges_.find(nodes[pos].id, nodes[static_cast<size_t>(next)].id);
        if (m == nullptr) return;
        heap.push_back(BpeWork::HeapEntry{m->rank, pos, m->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<uint32_t>(i));
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), later);
        const BpeWork::HeapEntry top = heap.back();
        heap.pop_back();
        BpeWork::Node& node = nodes[top.pos];
        if (!node.alive || node.next < 0) continue;
        BpeWork::Node& right = nodes[static_cast<size_t>(node.next)];
        const MergeMap::Merge* m = merges_.find(node.id, right.id);
        if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
        node.id = top.new_id;
        right.alive = false;
        node.next = right.next;
        if (right.next >= 0)
            nodes[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
        if (node.prev >= 0) push(static_cast<uint32_t>(node.prev));
        if (node.next >= 0) push(top.pos);
    }
    sym.clear();
    for (int32_t i = 0; i >= 0; i = nodes[static_cast<size_t>(i)].next) {
        sym.push_back(nodes[static_cast<size_t>(i)].id);
    }
}

}  // namespace lathe
