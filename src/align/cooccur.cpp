#include "align/cooccur.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <numeric>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "core/progress.h"

namespace lathe {
namespace {

// Runs fn(t) for t in [0, threads) on that many threads (the caller's thread runs t = 0).
template <typename Fn>
void run_threads(int threads, Fn&& fn) {
    std::vector<std::thread> pool;
    pool.reserve(size_t(threads > 0 ? threads - 1 : 0));
    for (int t = 1; t < threads; ++t) pool.emplace_back([&fn, t] { fn(t); });
    fn(0);
    for (auto& th : pool) th.join();
}

// Documents [begin, end) of thread t when `docs` are split into `threads` contiguous blocks.
std::pair<uint64_t, uint64_t> block_of(uint64_t docs, int threads, int t) {
    return {docs * uint64_t(t) / uint64_t(threads), docs * uint64_t(t + 1) / uint64_t(threads)};
}

// An open-addressing (linear probing) map from a (row, col) key to a double sum. Grows by
// doubling up to max_capacity slots; beyond that the owner flushes it into a sorted run.
class PairTable {
public:
    static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
    static constexpr size_t kSlotBytes = sizeof(uint64_t) + sizeof(double);

    explicit PairTable(size_t max_capacity)
        : max_capacity_(
              std::max<size_t>(std::bit_floor(std::max<size_t>(max_capacity, 1024)), 1024)) {
        reset(std::min<size_t>(max_capacity_, 1 << 16));
    }

    // Adds v to key's sum. Returns false (and adds nothing) when the table is full at its largest
    // size: the caller flushes and retries.
    bool add(uint64_t key, double v) {
        size_t i = slot_of(key);
        while (true) {
            if (keys_[i] == key) {
                values_[i] += v;
                return true;
            }
            if (keys_[i] == kEmpty) break;
            i = (i + 1) & mask_;
        }
        if ((size_ + 1) * 10 > keys_.size() * 7) {  // load factor 0.7
            if (keys_.size() >= max_capacity_) return false;
            grow();
            return add(key, v);
        }
        keys_[i] = key;
        values_[i] = v;
        ++size_;
        return true;
    }

    size_t size() const { return size_; }

    // Appends the contents sorted by key and empties the table (keeping its capacity).
    void drain_sorted(std::vector<std::pair<uint64_t, double>>& out) {
        const size_t start = out.size();
        for (size_t i = 0; i < keys_.size(); ++i)
            if (keys_[i] != kEmpty) out.emplace_back(keys_[i], values_[i]);
        std::sort(out.begin() + ptrdiff_t(start), out.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        std::fill(keys_.begin(), keys_.end(), kEmpty);
        size_ = 0;
    }

private:
    size_t slot_of(uint64_t key) const {
        return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
    }
    void reset(size_t capacity) {
        keys_.assign(capacity, kEmpty);
        values_.assign(capacity, 0.0);
        mask_ = capacity - 1;
        shift_ = 64 - std::countr_zero(capacity);
        size_ = 0;
    }
    void grow() {
        std::vector<uint64_t> keys = std::move(keys_);
        std::vector<double> values = std::move(values_);
        reset(keys.size() * 2);
        for (size_t i = 0; i < keys.size(); ++i) {
            if (keys[i] == kEmpty) continue;
            size_t j = slot_of(keys[i]);
            while (keys_[j] != kEmpty) j = (j + 1) & mask_;
            keys_[j] = keys[i];
            values_[j] = values[i];
            ++size_;
        }
    }

    size_t max_capacity_;
    std::vector<uint64_t> keys_;
    std::vector<double> values_;
    size_t mask_ = 0;
    int shift_ = 64;
    size_t size_ = 0;
};

// Merges sorted runs of (key, sum) into one sorted run, adding the sums of equal keys.
std::vector<std::pair<uint64_t, double>> merge_runs(
    std::vector<std::vector<std::pair<uint64_t, double>>>& runs) {
    if (runs.size() == 1) return std::move(runs[0]);
    std::vector<std::pair<uint64_t, double>> all;
    size_t total = 0;
    for (const auto& r : runs) total += r.size();
    all.reserve(total);
    for (auto& r : runs) {
        all.insert(all.end(), r.begin(), r.end());
        r.clear();
        r.shrink_to_fit();
    }
    // Stable: equal keys keep run order, so sums are added in corpus order.
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t out = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        if (out > 0 && all[out - 1].first == all[i].first)
            all[out - 1].second += all[i].second;
        else
            all[out++] = all[i];
    }
    all.resize(out);
    return all;
}

}  // namespace

int embed_thread_count(int threads) {
    if (threads > 0) return threads;
    return int(std::max(1u, std::thread::hardware_concurrency()));
}

Result<EmbedVocab> embed_count_vocab(const IndexedDataset& data, int64_t min_count, int threads) {
    threads = embed_thread_count(threads);
    const uint64_t docs = data.document_count();
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(threads));
    std::vector<int64_t> bad_doc(size_t(threads), -1);
    run_threads(threads, [&](int t) {
        auto [begin, end] = block_of(docs, threads, t);
        std::vector<int64_t>& c = counts[size_t(t)];
        std::vector<int64_t> tokens;
        for (uint64_t k = begin; k < end; ++k) {
            tokens.clear();
            data.read_document(k, tokens);
            for (int64_t id : tokens) {
                if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
                    bad_doc[size_t(t)] = int64_t(k);
                    return;
                }
                if (size_t(id) >= c.size()) c.resize(size_t(id) + 1, 0);
                ++c[size_t(id)];
            }
        }
    });
    for (int t = 0; t < threads; ++t)
        if (bad_doc[size_t(t)] >= 0)
            return data_loss_error(
                "{}: document {} holds a token id that is negative or above 2^31 - 1: not a "
                "token file of a tokenizer",
                data.prefix(), bad_doc[size_t(t)]);
    size_t max_ids = 0;
    for (const auto& c : counts) max_ids = std::max(max_ids, c.size());
    std::vector<int64_t> total(max_ids, 0);
    for (const auto& c : counts)
        for (size_t i = 0; i < c.size(); ++i) total[i] += c[i];

    EmbedVocab vocab;
    vocab.documents = int64_t(docs);
    vocab.corpus_tokens = std::accumulate(total.begin(), total.end(), int64_t{0});
    vocab.row_of_token.assign(max_ids, -1);
    for (size_t id = 0; id < max_ids; ++id)
        if (total[id] >= min_count && total[id] > 0) vocab.token_of_row.push_back(int32_t(id));
    if (vocab.token_of_row.empty())
        return invalid_argument_error(
            "{}: no token occurs at least {} times ({} tokens in {} documents): use a larger "
            "corpus or lower --min-count",
            data.prefix(), min_count, vocab.corpus_tokens, docs);
    std::stable_sort(vocab.token_of_row.begin(), vocab.token_of_row.end(),
                     [&](int32_t a, int32_t b) { return total[size_t(a)] > total[size_t(b)]; });
    for (size_t r = 0; r < vocab.token_of_row.size(); ++r) {
        vocab.row_of_token[size_t(vocab.token_of_row[r])] = int32_t(r);
        vocab.count_of_row.push_back(total[size_t(vocab.token_of_row[r])]);
    }
    return vocab;
}

std::vector<CooccurEntry> cooccur_count(const IndexedDataset& data, const EmbedVocab& vocab,
                                        const CooccurOptions& options) {
    LATHE_CHECK(options.window >= 1, "window={}", options.window);
    const int threads = embed_thread_count(options.threads);
    const int64_t V = vocab.size();
    LATHE_CHECK(V > 0 && V <= int64_t{std::numeric_limits<int32_t>::max()}, "V={}", V);

    // Shards: each row goes to the shard with the fewest events so far, largest rows first
    // (rows are already in descending count order). Events of a row ~ its count.
    std::vector<uint16_t> shard_of_row(static_cast<size_t>(V));
    {
        std::vector<int64_t> load(size_t(threads), 0);
        for (int64_t r = 0; r < V; ++r) {
            const size_t s = size_t(std::min_element(load.begin(), load.end()) - load.begin());
            shard_of_row[size_t(r)] = uint16_t(s);
            load[s] += vocab.count_of_row[size_t(r)];
        }
    }
    std::vector<float> weight(size_t(options.window) + 1, 1.0f);
    if (options.distance_weighting)
        for (int d = 1; d <= options.window; ++d) weight[size_t(d)] = float(1.0 / d);

    const size_t table_slots =
        std::max<size_t>(options.memory_bytes / PairTable::kSlotBytes / size_t(threads), 1024);
    const uint64_t docs = data.document_count();
    std::vector<std::vector<std::pair<uint64_t, double>>> shard_entries(
        static_cast<size_t>(threads));
    std::vector<size_t> shard_flushes(size_t(threads), 0);
    Progress progress("co-occurrence", data.bin_bytes(), "docs");
    const double bytes_per_doc = docs > 0 ? double(data.bin_bytes()) / double(docs) : 0.0;

    run_threads(threads, [&](int t) {
        PairTable table(table_slots);
        std::vector<std::vector<std::pair<uint64_t, double>>> runs;
        std::vector<int64_t> tokens;
        std::vector<uint32_t> rows;
        for (uint64_t k = 0; k < docs; ++k) {
            tokens.clear();
            data.read_document(k, tokens);
            rows.clear();
            for (int64_t id : tokens) {
                // ids were validated by embed_count_vocab; ids past the table were never counted.
                const int32_t r =
                    size_t(id) < vocab.row_of_token.size() ? vocab.row_of_token[size_t(id)] : -1;
                if (r >= 0) rows.push_back(uint32_t(r));
            }
            const int64_t n = int64_t(rows.size());
            for (int64_t p = 0; p < n; ++p) {
                const uint32_t a = rows[size_t(p)];
                if (shard_of_row[a] != t) continue;
                const uint64_t high = uint64_t(a) << 32;
                const int64_t lo = std::max<int64_t>(0, p - options.window);
                const int64_t hi = std::min<int64_t>(n - 1, p + options.window);
                for (int64_t q = lo; q <= hi; ++q) {
                    if (q == p) continue;
                    const uint64_t key = high | rows[size_t(q)];
                    const double v = weight[size_t(q > p ? q - p : p - q)];
                    if (!table.add(key, v)) {
                        runs.emplace_back();
                        table.drain_sorted(runs.back());
                        ++shard_flushes[size_t(t)];
                        table.add(key, v);
                    }
                }
            }
            if (t == 0 && (k & 255) == 255) progress.add(uint64_t(256 * bytes_per_doc), 256);
        }
        runs.emplace_back();
        table.drain_sorted(runs.back());
        shard_entries[size_t(t)] = merge_runs(runs);
    });
    progress.finish();
    size_t flushes = 0;
    for (size_t f : shard_flushes) flushes += f;
    if (flushes > 0)
        log_info(
            "co-occurrence: the counting tables filled {} times (memory limit {}); runs "
            "merged",
            flushes, Progress::format_bytes(double(options.memory_bytes)));

    // Place every shard's sorted entries at its rows' offsets: the result is sorted by (row, col).
    std::vector<uint64_t> offset(size_t(V) + 1, 0);
    for (const auto& shard : shard_entries)
        for (const auto& [key, v] : shard) ++offset[size_t(key >> 32) + 1];
    std::partial_sum(offset.begin(), offset.end(), offset.begin());
    std::vector<CooccurEntry> out(offset[size_t(V)]);
    run_threads(threads, [&](int t) {
        for (const auto& [key, v] : shard_entries[size_t(t)]) {
            const uint32_t row = uint32_t(key >> 32);
            out[offset[row]++] = CooccurEntry{row, uint32_t(key & 0xFFFFFFFFu), float(v)};
        }
        shard_entries[size_t(t)].clear();
        shard_entries[size_t(t)].shrink_to_fit();
    });
    return out;
}

}  // namespace lathe
