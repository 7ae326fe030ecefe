// Byte-level BPE training (see bpe_trainer.h for the contract and the HF rules reproduced).
//
// Data layout: every distinct word is a run of symbol ids in one flat array (`symbols`), shrunk
// in place as merges apply. Pair counts live in an open-addressing map keyed by
// (left id << 32 | right id), so comparing keys as integers is comparing pairs lexicographically,
// which is HF's tie-break. Each queue entry owns a list of word indices (a "position set"), in
// increasing order and without repeats.

#include "tokenizer/bpe_trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <queue>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/strings.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer: every input bit reaches every output bit
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t hash_bytes(std::string_view s) {
    constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
    uint64_t h = kMul ^ (s.size() * 0xff51afd7ed558ccdull);
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
        uint64_t v;
        std::memcpy(&v, s.data() + i, 8);
        h = (h ^ mix64(v)) * kMul;
        h = (h << 29) | (h >> 35);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    h ^= mix64(tail ^ (uint64_t(s.size() - i) << 56));
    return mix64(h);
}

// Open-addressing hash map from a pair key to V (linear probing, power-of-two capacity). The key
// ~0 marks an empty slot; pair keys never reach it because ids stay below 2^31.
template <typename V>
class PairMap {
public:
    static constexpr uint64_t kEmpty = ~uint64_t(0);

    explicit PairMap(size_t expected = 1024) { rehash(capacity_for(expected)); }

    // The value for `key`, inserted as V{} if absent.
    V& operator[](uint64_t key) {
        if ((size_ + 1) * 10 > slots_.size() * 7) rehash(slots_.size() * 2);
        size_t i = mix64(key) & mask_;
        while (true) {
            Slot& s = slots_[i];
            if (s.key == key) return s.value;
            if (s.key == kEmpty) {
                s.key = key;
                s.value = V{};
                ++size_;
                return s.value;
            }
            i = (i + 1) & mask_;
        }
    }
    const V* find(uint64_t key) const {
        size_t i = mix64(key) & mask_;
        while (true) {
            const Slot& s = slots_[i];
            if (s.key == key) return &s.value;
            if (s.key == kEmpty) return nullptr;
            i = (i + 1) & mask_;
        }
    }
    size_t size() const { return size_; }
    template <typename F>
    void for_each(F&& f) const {
        for (const Slot& s : slots_)
            if (s.key != kEmpty) f(s.key, s.value);
    }

private:
    struct Slot {
        uint64_t key;
        V value;
    };
    static size_t capacity_for(size_t n) {
        size_t c = 16;
        while (c * 7 < n * 10) c *= 2;
        return c;
    }
    void rehash(size_t capacity) {
        std::vector<Slot> old = std::move(slots_);
        slots_.assign(capacity, Slot{kEmpty, V{}});
        mask_ = capacity - 1;
        size_ = 0;
        for (const Slot& s : old)
            if (s.key != kEmpty) (*this)[s.key] = s.value;
    }
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

uint64_t pair_key(uint32_t a, uint32_t b) {
    return (uint64_t(a) << 32) | b;
}
uint32_t pair_left(uint64_t key) {
    return uint32_t(key >> 32);
}
uint32_t pair_right(uint64_t key) {
    return uint32_t(key);
}

// Runs f(t) for t in [0, n) on n threads (t = 0 on the calling thread).
template <typename F>
void run_on_threads(int n, F&& f) {
    if (n <= 1) {
        f(0);
        return;
    }
    std::vector<std::thread> workers;
    workers.reserve(n - 1);
    for (int t = 1; t < n; ++t) workers.emplace_back([&f, t] { f(t); });
    f(0);
    for (auto& w : workers) w.join();
}

// GPT-2's bytes_to_unicode: the code point that stands for byte b.
uint32_t byte_code_point(uint8_t b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (printable) return b;
    uint32_t n = 0;  // rank of b among the non-printable bytes
    for (uint32_t c = 0; c < b; ++c) {
        const bool p = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
        if (!p) ++n;
    }
    return 256 + n;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
}

// One change to a pair count caused by merging inside one word (HF's Word::merge output).
struct PairChange {
    uint64_t pair;
    int32_t delta;  // -1 or +1 occurrence
    uint32_t word;
};

// Merges every non-overlapping (a, b), left to right, in one word (symbols[0..len)), writing the
// shorter word in place; returns the new length. Emits the count changes exactly as HF's
// Word::merge does: for each occurrence, (prev, a) -1 and (prev, new) +1 when there is a symbol
// before it (possibly a replacement made earlier in this word), then (b, next) -1 and (new, next)
// +1 when there is one after it. The merged pair itself is not decremented (HF's rule).
uint32_t merge_word(uint32_t* symbols, uint32_t len, uint32_t a, uint32_t b, uint32_t replacement,
                    uint32_t word, std::vector<PairChange>& changes) {
    uint32_t w = 0;
    uint32_t r = 0;
    while (r < len) {
        if (symbols[r] == a && r + 1 < len && symbols[r + 1] == b) {
            if (w > 0) {
                changes.push_back({pair_key(symbols[w - 1], a), -1, word});
                changes.push_back({pair_key(symbols[w - 1], replacement), +1, word});
            }
            symbols[w] = replacement;
            r += 2;
            if (r < len) {
                changes.push_back({pair_key(b, symbols[r]), -1, word});
                changes.push_back({pair_key(replacement, symbols[r]), +1, word});
            }
            ++w;
        } else {
            symbols[w++] = symbols[r++];
        }
    }
    return w;
}

// A queue entry: a pair, the count it had when queued, and the words to merge it in.
struct QueueEntry {
    int64_t count;
    uint64_t pair;
    uint32_t set;  // index into the position-set pool; also breaks ties between equal entries
};
struct QueueLess {  // std::priority_queue pops the greatest: highest count, then smallest pair
    bool operator()(const QueueEntry& x, const QueueEntry& y) const {
        if (x.count != y.count) return x.count < y.count;
        if (x.pair != y.pair) return x.pair > y.pair;
        return x.set > y.set;
    }
};

// Below this many words a merge is applied on the calling thread: starting threads costs more.
constexpr size_t kParallelMergeMinWords = 8192;

}  // namespace

// ---------------------------------------------------------------------------------------------
// WordCounts

// A shard: open addressing with linear probing. Words of up to 8 bytes live inside their slot
// (most occurrences are short words, and comparing them then touches no other memory); longer
// ones live in the arena.
struct WordCounts::Shard {
    static constexpr uint32_t kInlineBytes = 8;
    struct Slot {
        uint64_t hash;
        uint64_t data;   // the word's bytes (len <= kInlineBytes, zero-padded) or arena offset
        uint64_t count;  // 0 = empty slot
        uint32_t len;
    };
    std::string arena;
    std::vector<Slot> slots = std::vector<Slot>(64, Slot{0, 0, 0, 0});
    size_t used = 0;
    uint64_t total = 0;

    static uint64_t inline_value(std::string_view w) {
        uint64_t v = 0;
        std::memcpy(&v, w.data(), w.size());
        return v;
    }
    std::string_view word(const Slot& s) const {
        if (s.len <= kInlineBytes) return {reinterpret_cast<const char*>(&s.data), s.len};
        return {arena.data() + s.data, s.len};
    }
    bool matches(const Slot& s, std::string_view w, uint64_t hash, uint64_t inline_v) const {
        if (s.hash != hash || s.len != w.size()) return false;
        if (s.len <= kInlineBytes) return s.data == inline_v;
        return std::memcmp(arena.data() + s.data, w.data(), w.size()) == 0;
    }

    void add(std::string_view w, uint64_t hash, uint64_t count) {
        if ((used + 1) * 10 > slots.size() * 7) grow();
        const uint64_t inline_v = w.size() <= kInlineBytes ? inline_value(w) : 0;
        const size_t mask = slots.size() - 1;
        size_t i = hash & mask;
        total += count;
        while (true) {
            Slot& s = slots[i];
            if (s.count == 0) {
                LATHE_CHECK(w.size() <= UINT32_MAX, "word of {} bytes", w.size());
                uint64_t data = inline_v;
                if (w.size() > kInlineBytes) {
                    data = arena.size();
                    arena.append(w);
                }
                s = Slot{hash, data, count, uint32_t(w.size())};
                ++used;
                return;
            }
            if (matches(s, w, hash, inline_v)) {
                s.count += count;
                return;
            }
            i = (i + 1) & mask;
        }
    }
    void prefetch(uint64_t hash) const { __builtin_prefetch(&slots[hash & (slots.size() - 1)]); }
    const Slot* find(std::string_view w, uint64_t hash) const {
        const uint64_t inline_v = w.size() <= kInlineBytes ? inline_value(w) : 0;
        const size_t mask = slots.size() - 1;
        size_t i = hash & mask;
        while (true) {
            const Slot& s = slots[i];
            if (s.count == 0) return nullptr;
            if (matches(s, w, hash, inline_v)) return &s;
            i = (i + 1) & mask;
        }
    }
    void grow() {
        std::vector<Slot> old = std::move(slots);
        slots.assign(old.size() * 2, Slot{0, 0, 0, 0});
        const size_t mask = slots.size() - 1;
        for (const Slot& s : old) {
            if (s.count == 0) continue;
            size_t i = s.hash & mask;
            while (slots[i].count != 0) i = (i + 1) & mask;
            slots[i] = s;
        }
    }
    void clear() {
        arena.clear();
        arena.shrink_to_fit();
        slots.assign(64, Slot{0, 0, 0, 0});
        used = 0;
        total = 0;
    }
};

WordCounts::WordCounts(int shard_count) {
    LATHE_CHECK(shard_count >= 1, "shard_count={}", shard_count);
    for (int i = 0; i < shard_count; ++i) shards_.push_back(std::make_unique<Shard>());
}
WordCounts::WordCounts(WordCounts&&) noexcept = default;
WordCounts& WordCounts::operator=(WordCounts&&) noexcept = default;
WordCounts::~WordCounts() = default;

int WordCounts::shard_for(uint64_t hash) const {
    // The high bits pick the shard; the low bits pick the slot inside it.
    return int((hash >> 40) % shards_.size());
}

void WordCounts::add(std::string_view word, uint64_t count) {
    if (word.empty() || count == 0) return;
    const uint64_t h = hash_bytes(word);
    shards_[shard_for(h)]->add(word, h, count);
}

void WordCounts::merge_from(std::vector<WordCounts>& parts, int threads) {
    for (const WordCounts& p : parts)
        LATHE_CHECK(p.shards_.size() == shards_.size(), "shard counts differ: {} vs {}",
                    p.shards_.size(), shards_.size());
    const int n = std::max(1, std::min<int>(threads, int(shards_.size())));
    std::atomic<size_t> next{0};
    run_on_threads(n, [&](int) {
        for (size_t s = next++; s < shards_.size(); s = next++) {
            Shard& into = *shards_[s];
            for (WordCounts& p : parts) {
                Shard& from = *p.shards_[s];
                for (const Shard::Slot& slot : from.slots)
                    if (slot.count != 0) into.add(from.word(slot), slot.hash, slot.count);
                from.clear();
            }
        }
    });
}

size_t WordCounts::size() const {
    size_t n = 0;
    for (const auto& s : shards_) n += s->used;
    return n;
}

uint64_t WordCounts::total() const {
    uint64_t n = 0;
    for (const auto& s : shards_) n += s->total;
    return n;
}

void WordCounts::add_many(std::span<const std::string_view> words) {
    thread_local std::vector<uint64_t> hashes;
    hashes.resize(words.size());
    for (size_t i = 0; i < words.size(); ++i) {
        hashes[i] = hash_bytes(words[i]);
        shards_[shard_for(hashes[i])]->prefetch(hashes[i]);
    }
    for (size_t i = 0; i < words.size(); ++i)
        if (!words[i].empty()) shards_[shard_for(hashes[i])]->add(words[i], hashes[i], 1);
}

uint64_t WordCounts::count(std::string_view word) const {
    if (word.empty()) return 0;
    const uint64_t h = hash_bytes(word);
    const Shard::Slot* s = shards_[shard_for(h)]->find(word, h);
    return s ? s->count : 0;
}

void WordCounts::visit(const std::function<void(std::string_view, uint64_t)>& f) const {
    for (const auto& shard : shards_)
        for (const Shard::Slot& s : shard->slots)
            if (s.count != 0) f(shard->word(s), s.count);
}

std::vector<std::pair<std::string_view, uint64_t>> WordCounts::entries() const {
    struct Entry {
        uint64_t hash;
        std::string_view word;
        uint64_t count;
    };
    std::vector<Entry> all;
    all.reserve(size());
    for (const auto& shard : shards_)
        for (const Shard::Slot& s : shard->slots)
            if (s.count != 0) all.push_back({s.hash, shard->word(s), s.count});
    std::sort(all.begin(), all.end(), [](const Entry& x, const Entry& y) {
        return x.hash != y.hash ? x.hash < y.hash : x.word < y.word;
    });
    std::vector<std::pair<std::string_view, uint64_t>> out;
    out.reserve(all.size());
    for (const Entry& e : all) out.emplace_back(e.word, e.count);
    return out;
}

// ---------------------------------------------------------------------------------------------
// Counting words

Result<WordCounts> bpe_count_words(const PreTokenizer& pre_tokenizer,
                                   const BpeBatchReader& next_batch, int threads,
                                   BpeOnError on_error, Progress* progress, BpeCountStats* stats) {
    if (threads < 1) return invalid_argument_error("threads must be at least 1, got {}", threads);
    constexpr int kShards = 64;
    std::vector<WordCounts> parts;
    for (int t = 0; t < threads; ++t) parts.emplace_back(kShards);
    std::mutex mutex;  // guards the reader, `stop`, `first_error` and `totals`
    bool stop = false;
    Status first_error;
    BpeCountStats totals;
    // A bad document at `where`: counted and skipped (true) under --on-error skip, else `error`
    // becomes the run's (the first one wins) and every thread stops (false).
    const auto skip_bad = [&](const std::string& where, Status error) {
        std::lock_guard<std::mutex> lock(mutex);
        if (on_error == BpeOnError::kSkip) {
            if (totals.skipped++ == 0) totals.first_skipped = where;
            return true;
        }
        if (first_error.ok()) first_error = std::move(error);
        stop = true;
        return false;
    };

    run_on_threads(threads, [&](int t) {
        WordCounts& counts = parts[t];
        BpeDocumentBatch batch;
        PieceList pieces;
        PieceList scratch;
        std::vector<std::string_view> views;
        BpeCountStats mine;
        while (true) {
            {
                std::lock_guard<std::mutex> lock(mutex);
                if (stop) break;
                batch.clear();
                Result<bool> more = next_batch(batch);
                if (!more.ok() || !*more) {
                    stop = true;
                    if (!more.ok() && first_error.ok()) first_error = more.status();
                    break;
                }
            }
            uint64_t batch_bytes = 0;
            uint64_t batch_docs = 0;
            for (size_t i = 0; i < batch.size(); ++i) {
                const std::string_view doc = batch.document(i);
                if (const std::optional<utf8::InvalidAt> bad = utf8::find_invalid(doc)) {
                    // The line of the first bad byte: the document's first line plus the
                    // newlines before it (a text block spans several lines).
                    const uint64_t line =
                        (i < batch.lines.size() ? batch.lines[i] : 0) + bad->line - 1;
                    const std::string where = fmt::format("{}:{}", batch.origin, line);
                    if (skip_bad(where, invalid_argument_error(
                                            "{}: not valid UTF-8 (byte 0x{:02x}); convert the "
                                            "input to UTF-8 (e.g. with iconv) or pass --on-error "
                                            "skip to leave such documents out",
                                            where, bad->byte)))
                        continue;
                    return;
                }
                if (Status split = pre_tokenizer.split(doc, pieces, scratch); !split.ok()) {
                    const std::string where = fmt::format(
                        "{}:{}", batch.origin, i < batch.lines.size() ? batch.lines[i] : 0);
                    if (skip_bad(where, invalid_argument_error("{}: {} (or pass --on-error skip "
                                                               "to leave such documents out)",
                                                               where, split.message())))
                        continue;
                    return;
                }
                views.clear();
                for (size_t k = 0; k < pieces.size(); ++k) views.push_back(pieces.view(k));
                counts.add_many(views);
                batch_bytes += doc.size();
                ++batch_docs;
            }
            mine.documents += batch_docs;
            mine.bytes += batch_bytes;
            if (progress) progress->add(batch_bytes, batch_docs);
        }
        std::lock_guard<std::mutex> lock(mutex);
        totals.documents += mine.documents;
        totals.bytes += mine.bytes;
    });
    LATHE_RETURN_IF_ERROR(first_error);

    // Merge the per-thread maps (still in byte-level text), then turn every distinct word back
    // into the bytes it stands for: once per distinct word, not once per occurrence.
    WordCounts merged(kShards);
    merged.merge_from(parts, threads);
    WordCounts words(kShards);
    std::string bytes;
    std::string not_byte_level;
    merged.visit([&](std::string_view symbols, uint64_t count) {
        bytes.clear();
        if (byte_level_decode(symbols, bytes)) {
            words.add(bytes, count);
        } else if (not_byte_level.empty()) {
            not_byte_level = symbols;
        }
    });
    if (!not_byte_level.empty())
        return internal_error(
            "the pre-tokenizer produced '{}', which is not byte-level text; the trainer's "
            "pre-tokenizer must end in ByteLevel",
            escape_for_message(not_byte_level));
    if (stats) *stats = totals;
    return words;
}

// ---------------------------------------------------------------------------------------------
// Training

const char* bpe_stop_reason_name(BpeStopReason reason) {
    switch (reason) {
        case BpeStopReason::kVocabSizeReached:
            return "vocabulary size reached";
        case BpeStopReason::kNoPairsLeft:
            return "no pairs left to merge";
        case BpeStopReason::kMinFrequency:
            return "best pair below min_frequency";
    }
    return "?";
}

std::string bpe_byte_symbol(uint8_t byte) {
    std::string s;
    append_utf8(s, byte_code_point(byte));
    return s;
}

Result<BpeTrainerResult> bpe_train(const WordCounts& word_counts,
                                   const BpeTrainerOptions& options) {
    if (options.threads < 1)
        return invalid_argument_error("threads must be at least 1, got {}", options.threads);
    BpeTrainerResult result;
    std::unordered_map<std::string, int32_t> token_to_id;
    auto add_token = [&](const std::string& token) -> int32_t {
        auto [it, inserted] = token_to_id.emplace(token, int32_t(result.vocab.size()));
        if (inserted) result.vocab.push_back(token);
        return it->second;
    };

    // 1. Special tokens at ids 0..k-1 (a repeat keeps its first id).
    for (const std::string& t : options.special_tokens) {
        if (t.empty()) return invalid_argument_error("a special token is empty; remove it");
        if (!utf8::is_valid(t))
            return invalid_argument_error("special token '{}' is not valid UTF-8",
                                          escape_for_message(t));
        result.special_ids.push_back(add_token(t));
    }
    const int64_t min_vocab = int64_t(result.vocab.size()) + 256;
    if (options.vocab_size < min_vocab)
        return invalid_argument_error(
            "vocab size {} is too small: the {} special token(s) and the 256 byte symbols "
            "already take {}; ask for at least {}",
            options.vocab_size, result.vocab.size(), min_vocab, min_vocab);

    // 2. The alphabet: all 256 byte symbols, sorted by code point (HF sorts its alphabet so).
    std::vector<uint8_t> bytes_by_code_point(256);
    for (int b = 0; b < 256; ++b) bytes_by_code_point[b] = uint8_t(b);
    std::sort(bytes_by_code_point.begin(), bytes_by_code_point.end(),
              [](uint8_t x, uint8_t y) { return byte_code_point(x) < byte_code_point(y); });
    uint32_t byte_id[256];
    for (uint8_t b : bytes_by_code_point) byte_id[b] = uint32_t(add_token(bpe_byte_symbol(b)));

    // 3. Words as symbol runs, in a fixed order so that nothing below depends on how the counting
    //    was split across threads.
    const auto sorted_words = word_counts.entries();
    const size_t word_count = sorted_words.size();
    LATHE_CHECK(word_count < UINT32_MAX, "{} distinct words", word_count);
    std::vector<uint64_t> counts(word_count);
    std::vector<uint64_t> offsets(word_count + 1);
    std::vector<uint32_t> lengths(word_count);
    uint64_t total_symbols = 0;
    for (size_t w = 0; w < word_count; ++w) {
        offsets[w] = total_symbols;
        lengths[w] = uint32_t(sorted_words[w].first.size());
        counts[w] = sorted_words[w].second;
        total_symbols += sorted_words[w].first.size();
    }
    offsets[word_count] = total_symbols;
    std::vector<uint32_t> symbols(total_symbols);
    for (size_t w = 0; w < word_count; ++w) {
        const std::string_view word = sorted_words[w].first;
        for (size_t i = 0; i < word.size(); ++i)
            symbols[offsets[w] + i] = byte_id[uint8_t(word[i])];
    }

    // 4. Count pairs; one position set per pair (the words where it occurs, increasing).
    PairMap<int64_t> pair_counts(std::max<size_t>(1024, total_symbols / 8));
    std::vector<std::vector<uint32_t>> sets;  // position-set pool
    std::vector<uint32_t> free_sets;
    std::priority_queue<QueueEntry, std::vector<QueueEntry>, QueueLess> queue;
    {
        PairMap<uint32_t> set_of_pair(std::max<size_t>(1024, total_symbols / 8));
        for (uint32_t w = 0; w < word_count; ++w) {
            const uint32_t* s = symbols.data() + offsets[w];
            for (uint32_t i = 0; i + 1 < lengths[w]; ++i) {
                const uint64_t key = pair_key(s[i], s[i + 1]);
                pair_counts[key] += int64_t(counts[w]);
                uint32_t& set_plus_one = set_of_pair[key];  // 0 = no set yet
                if (set_plus_one == 0) {
                    sets.emplace_back();
                    set_plus_one = uint32_t(sets.size());
                }
                std::vector<uint32_t>& pos = sets[set_plus_one - 1];
                if (pos.empty() || pos.back() != w) pos.push_back(w);
            }
        }
        set_of_pair.for_each([&](uint64_t key, uint32_t set_plus_one) {
            queue.push({*pair_counts.find(key), key, set_plus_one - 1});
        });
    }

    // 5. Merge.
    // Pairs given new occurrences during the current merge step -> their new position set. A
    // stamp instead of clearing: an entry whose stamp is not the current step is absent.
    struct Pending {
        int64_t step;
        uint32_t set;
    };
    PairMap<Pending> pending(4096);
    std::vector<uint64_t> pending_pairs;
    std::vector<std::pair<uint64_t, int32_t>> merge_list;  // (pair, new id), repeats included
    std::vector<std::vector<PairChange>> changes(options.threads);
    const auto new_set = [&]() -> uint32_t {
        if (!free_sets.empty()) {
            const uint32_t s = free_sets.back();
            free_sets.pop_back();
            return s;
        }
        sets.emplace_back();
        return uint32_t(sets.size() - 1);
    };

    result.stop_reason = BpeStopReason::kNoPairsLeft;
    for (int64_t step = 0;; ++step) {
        if (int64_t(result.vocab.size()) >= options.vocab_size) {
            result.stop_reason = BpeStopReason::kVocabSizeReached;
            break;
        }
        if (queue.empty()) {
            result.stop_reason = BpeStopReason::kNoPairsLeft;
            break;
        }
        QueueEntry top = queue.top();
        queue.pop();
        const int64_t current = *pair_counts.find(top.pair);
        if (top.count != current) {
            top.count = current;
            queue.push(top);
            continue;
        }
        if (top.count < 1) {
            result.stop_reason = BpeStopReason::kNoPairsLeft;
            break;
        }
        if (uint64_t(top.count) < options.min_frequency) {
            result.stop_reason = BpeStopReason::kMinFrequency;
            break;
        }

        const uint32_t a = pair_left(top.pair);
        const uint32_t b = pair_right(top.pair);
        const int32_t new_id = add_token(result.vocab[a] + result.vocab[b]);
        merge_list.emplace_back(top.pair, new_id);

        // Apply the merge to the entry's words (in parallel when there are many).
        // Moved out: new_set() below may grow the pool and move its vectors.
        const std::vector<uint32_t> pos = std::move(sets[top.set]);
        sets[top.set].clear();
        free_sets.push_back(top.set);
        const int nthreads =
            pos.size() >= kParallelMergeMinWords ? std::min<int>(options.threads, 64) : 1;
        run_on_threads(nthreads, [&](int t) {
            std::vector<PairChange>& out = changes[t];
            out.clear();
            const size_t begin = pos.size() * t / nthreads;
            const size_t end = pos.size() * (t + 1) / nthreads;
            for (size_t k = begin; k < end; ++k) {
                const uint32_t w = pos[k];
                lengths[w] = merge_word(symbols.data() + offsets[w], lengths[w], a, b,
                                        uint32_t(new_id), w, out);
            }
        });

        // Fold the changes into the counts (in word order, whatever the thread split) and collect
        // the words where each pair gained occurrences.
        pending_pairs.clear();
        for (int t = 0; t < nthreads; ++t) {
            for (const PairChange& c : changes[t]) {
                pair_counts[c.pair] += int64_t(c.delta) * int64_t(counts[c.word]);
                if (c.delta <= 0) continue;
                Pending& p = pending[c.pair];
                if (p.step != step + 1) {  // stamps are step + 1 so that 0 means never
                    p.step = step + 1;
                    p.set = new_set();
                    pending_pairs.push_back(c.pair);
                }
                std::vector<uint32_t>& into = sets[p.set];
                if (into.empty() || into.back() != c.word) into.push_back(c.word);
            }
        }
        for (uint64_t key : pending_pairs) {
            const uint32_t set = pending.find(key)->set;
            const int64_t count = *pair_counts.find(key);
            if (count > 0) {
                queue.push({count, key, set});
            } else {
                sets[set].clear();
                free_sets.push_back(set);
            }
        }
    }
    result.merge_steps = int64_t(merge_list.size());

    // A pair merged more than once keeps its last rank (HF's merge map overwrites).
    PairMap<int64_t> last_rank(merge_list.size() + 16);
    for (size_t i = 0; i < merge_list.size(); ++i) last_rank[merge_list[i].first] = int64_t(i) + 1;
    for (size_t i = 0; i < merge_list.size(); ++i) {
        const uint64_t key = merge_list[i].first;
        if (*last_rank.find(key) == int64_t(i) + 1)
            result.merges.emplace_back(int32_t(pair_left(key)), int32_t(pair_right(key)));
    }
    return result;
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json (written by hand: vocabularies reach 10^5 entries, and the order of keys matters)

namespace {

// Llama-3's split pattern (also what HF's Llama-3 tokenizer.json carries): contractions, letters
// with one leading non-letter, numbers of 1-3 digits, punctuation runs, newlines, spaces.
constexpr std::string_view kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::string byte_level_json(bool add_prefix_space, bool trim_offsets, bool use_regex) {
    return fmt::format(
        "{{\"type\": \"ByteLevel\", \"add_prefix_space\": {}, \"trim_offsets\": {}, "
        "\"use_regex\": {}}}",
        add_prefix_space, trim_offsets, use_regex);
}

}  // namespace

Result<BpePreTokenizerKind> bpe_pre_tokenizer_kind_from_name(std::string_view name) {
    if (name == "gpt2") return BpePreTokenizerKind::kGpt2;
    if (name == "llama3") return BpePreTokenizerKind::kLlama3;
    if (name == "bytelevel-noregex") return BpePreTokenizerKind::kByteLevelNoRegex;
    return invalid_argument_error(
        "unknown pre-tokenizer '{}'; expected gpt2, llama3 or bytelevel-noregex", name);
}

std::string bpe_pre_tokenizer_json(BpePreTokenizerKind kind) {
    switch (kind) {
        case BpePreTokenizerKind::kGpt2:
            return byte_level_json(false, true, true);
        case BpePreTokenizerKind::kByteLevelNoRegex:
            return byte_level_json(false, true, false);
        case BpePreTokenizerKind::kLlama3:
            return fmt::format(
                "{{\"type\": \"Sequence\", \"pretokenizers\": [{{\"type\": \"Split\", "
                "\"pattern\": {{\"Regex\": {}}}, \"behavior\": \"Isolated\", \"invert\": false}}, "
                "{}]}}",
                json_string(kLlama3Pattern), byte_level_json(false, true, false));
    }
    LATHE_CHECK(false, "unknown pre-tokenizer kind {}", int(kind));
    return {};
}

std::string bpe_trainer_tokenizer_json(const BpeTrainerResult& result, BpePreTokenizerKind kind) {
    std::string out;
    out.reserve(result.vocab.size() * 48 + result.merges.size() * 40 + 4096);
    out += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
    out += "  \"added_tokens\": [";
    std::vector<bool> seen(result.vocab.size(), false);
    bool first = true;
    for (const int32_t id : result.special_ids) {
        if (seen[id]) continue;
        seen[id] = true;
        out += first ? "\n" : ",\n";
        first = false;
        out += fmt::format(
            "    {{\"id\": {}, \"content\": {}, \"single_word\": false, "
            "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
            "\"special\": true}}",
            id, json_string(result.vocab[id]));
    }
    out += first ? "],\n" : "\n  ],\n";
    out += "  \"normalizer\": null,\n";
    out += "  \"pre_tokenizer\": " + bpe_pre_tokenizer_json(kind) + ",\n";
    // As GPT-2's tokenizer.json: the post-processor only adjusts offsets (adds no ids), the
    // decoder maps the byte symbols back to bytes.
    out += "  \"post_processor\": " + byte_level_json(true, false, true) + ",\n";
    out += "  \"decoder\": " + byte_level_json(true, true, true) + ",\n";
    out +=
        "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
        "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
        "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
        "    \"vocab\": {";
    for (size_t id = 0; id < result.vocab.size(); ++id) {
        out += id == 0 ? "\n      " : ",\n      ";
        append_json_string(out, result.vocab[id]);
        out += fmt::format(": {}", id);
    }
    out += result.vocab.empty() ? "},\n" : "\n    },\n";
    out += "    \"merges\": [";
    for (size_t i = 0; i < result.merges.size(); ++i) {
        out += i == 0 ? "\n      [" : ",\n      [";
        append_json_string(out, result.vocab[result.merges[i].first]);
        out += ", ";
        append_json_string(out, result.vocab[result.merges[i].second]);
        out += "]";
    }
    out += result.merges.empty() ? "]\n" : "\n    ]\n";
    out += "  }\n}\n";
    return out;
}

}  // namespace lathe
