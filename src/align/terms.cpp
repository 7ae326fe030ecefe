#include "align/terms.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "align/stage_cache.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/ordered_pool.h"
#include "core/progress.h"
#include "core/strings.h"
#include "data/jsonl.h"
#include "data/prepare.h"
#include "io/file.h"
#include "io/input.h"
#include "io/json.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Batches of documents handed from the reader to the workers: about this many bytes each.
constexpr size_t kBatchBytes = size_t{1} << 20;
// Candidates are scored in chunks of this many.
constexpr size_t kScoreChunk = 256;
// The shared candidate table is split into this many independently locked shards.
constexpr size_t kShards = 64;

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using CountTable = std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>>;

bool is_ascii_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// ---- reading the corpus ---------------------------------------------------------------------

struct Batch {
    std::string data;             // the records back to back
    std::vector<uint32_t> ends;   // end offset of each record in data
    std::vector<uint64_t> lines;  // 1-based first line of each record
    const std::string* file = nullptr;
    bool jsonl = false;
    // Filled by the worker.
    uint64_t documents = 0;
    uint64_t skipped = 0;
    uint64_t pieces = 0;
};

// What one worker does with a document's raw pieces, and at the end of each batch.
struct ScanSink {
    std::function<void(int worker, const std::vector<std::string_view>& raw_pieces)> on_document;
    std::function<void(int worker)> on_batch_end;
};

struct ScanTotals {
    uint64_t documents = 0;
    uint64_t skipped = 0;
    uint64_t pieces = 0;
    uint64_t input_bytes = 0;
};

// The source tokenizer's text pipeline: normalizer (optional) and byte-level pre-tokenizer.
struct TextPipeline {
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
};

// Cuts `files` into batches of documents, in order, on the calling thread. Format auto looks at
// the first non-blank line of each file, as `lathe prepare` does, and then reads it line by line
// (one document per line) either way.
class CorpusReader {
public:
    CorpusReader(const std::vector<std::string>& files, const TermsOptions& options,
                 const std::string& label, Progress* progress)
        : files_(files), options_(options), label_(label), progress_(progress) {}

    Result<bool> read(Batch& b) {
        for (;;) {
            if (!open_) {
                if (next_file_ == files_.size()) return false;
                LATHE_RETURN_IF_ERROR(open(files_[next_file_++]));
            }
            b.data.clear();
            b.ends.clear();
            b.lines.clear();
            b.file = &files_[next_file_ - 1];
            b.jsonl = jsonl_;
            auto add = [&b](std::string_view text, uint64_t line) {
                b.data.append(text);
                b.ends.push_back(static_cast<uint32_t>(b.data.size()));
                b.lines.push_back(line);
            };
            if (pending_.has_value()) {
                add(*pending_, pending_line_);
                pending_.reset();
            }
            bool file_done = false;
            while (b.data.size() < kBatchBytes) {
                if (cancelled()) return cancelled_error("{}: cancelled", label_);
                if (use_lines_) {
                    std::string_view line;
                    LATHE_ASSIGN_OR_RETURN(const bool more, open_->lines.next(line));
                    if (!more) {
                        file_done = true;
                        break;
                    }
                    line = strip_cr(line);
                    if (jsonl_ && is_blank_line(line)) continue;
                    add(line, open_->lines.line_number());
                } else {
                    TextRecord rec;
                    LATHE_ASSIGN_OR_RETURN(const bool more, open_->records.next(rec));
                    if (!more) {
                        file_done = true;
                        break;
                    }
                    add(rec.text, rec.line);
                }
            }
            const uint64_t raw = open_->in.raw_bytes_read();
            if (progress_) progress_->add(raw - last_raw_, 0);
            last_raw_ = raw;
            if (file_done) open_.reset();
            if (!b.ends.empty()) return true;
        }
    }

private:
    struct OpenFile {
        InputStream in;
        LineReader lines;
        TextRecordReader records;
        OpenFile(InputStream stream, TextRecordFormat format)
            : in(std::move(stream)), lines(in), records(in, format) {}
    };

    bool cancelled() const { return options_.cancel != nullptr && options_.cancel->load(); }

    Status open(const std::string& file) {
        InputOptions in_options;
        in_options.cancel = options_.cancel;
        LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(file, in_options));
        const bool blocks = options_.format == TermsFormat::kTextBlocks;
        open_ = std::make_unique<OpenFile>(
            std::move(in), blocks ? TextRecordFormat::kBlocks : TextRecordFormat::kLines);
        last_raw_ = 0;
        jsonl_ = options_.format == TermsFormat::kJsonl;
        use_lines_ = jsonl_;
        if (options_.format == TermsFormat::kAuto) {
            std::string_view line;
            for (;;) {
                LATHE_ASSIGN_OR_RETURN(const bool more, open_->lines.next(line));
                if (!more) break;
                if (is_blank_line(line)) continue;
                jsonl_ = trim(line).front() == '{';
                pending_ = std::string(line);
                pending_line_ = open_->lines.line_number();
                break;
            }
            use_lines_ = true;
        }
        return ok_status();
    }

    const std::vector<std::string>& files_;
    const TermsOptions& options_;
    const std::string& label_;
    Progress* progress_;
    size_t next_file_ = 0;
    std::unique_ptr<OpenFile> open_;      // the file being read; null between files
    std::optional<std::string> pending_;  // the line read to detect the format
    uint64_t pending_line_ = 0;
    bool jsonl_ = false;
    bool use_lines_ = false;
    uint64_t last_raw_ = 0;
};

// Fills `pieces` with the pre-tokenizer's pieces of one document, normalized first when the
// pipeline has a normalizer (`normalized` holds that text). Errors: a pattern that gives up on
// the document.
Status split_document(const TextPipeline& pipeline, std::string_view text, std::string& normalized,
                      PieceList& pieces, PieceList& scratch) {
    std::string_view norm = text;
    if (pipeline.normalizer) {
        normalized.clear();
        LATHE_RETURN_IF_ERROR(pipeline.normalizer->normalize(text, normalized).status());
        norm = normalized;
    }
    return pipeline.pre_tokenizer->split(norm, pieces, scratch);
}

// Reads `files` on the calling thread and runs `sink` on `threads` workers (core/ordered_pool.h).
// The first error in input order stops the scan and is returned.
Status scan_corpus(const std::vector<std::string>& files, const TermsOptions& options,
                   const TextPipeline& pipeline, int threads, const ScanSink& sink,
                   const std::string& label, ScanTotals& totals) {
    auto cancelled = [&] { return options.cancel != nullptr && options.cancel->load(); };

    uint64_t total_raw = 0;
    for (const std::string& f : files) {
        auto size = file_size(f);
        if (size.ok()) total_raw += *size;
    }
    std::optional<Progress> progress;
    if (options.show_progress) progress.emplace(label, total_raw, "docs");
    CorpusReader reader(files, options, label, progress ? &*progress : nullptr);

    std::atomic<int> next_worker{0};
    auto make_worker = [&] {
        return [&, w = next_worker++, json = JsonlFieldReader(options.json_key),
                normalized = std::string(), raw = std::string(), piece_list = PieceList(),
                scratch = PieceList(), raw_ends = std::vector<size_t>(),
                raw_pieces = std::vector<std::string_view>()](Batch& batch) mutable -> Status {
            batch.documents = batch.skipped = batch.pieces = 0;
            uint32_t begin = 0;
            for (size_t r = 0; r < batch.ends.size(); ++r) {
                std::string_view text(batch.data.data() + begin, batch.ends[r] - begin);
                begin = batch.ends[r];
                std::string problem;
                if (batch.jsonl) {
                    auto v = json.extract(text);
                    if (v.ok()) {
                        text = *v;
                    } else {
                        problem = v.status().message();
                    }
                } else if (!utf8::is_valid(text)) {
                    problem = fmt::format("invalid UTF-8 at byte {}", utf8::first_invalid(text));
                }
                if (problem.empty()) {
                    // A normalizer or pre-tokenizer pattern can give up on the text (it
                    // backtracks too far): a bad document like the others.
                    const Status split =
                        split_document(pipeline, text, normalized, piece_list, scratch);
                    if (!split.ok()) problem = split.message();
                }
                if (!problem.empty()) {
                    if (options.skip_bad_documents) {
                        ++batch.skipped;
                        continue;
                    }
                    return invalid_argument_error(
                        "{}:{}: {} (fix the input, or pass --on-error skip to skip such "
                        "documents)",
                        *batch.file, batch.lines[r], problem);
                }
                raw.clear();
                raw_ends.clear();
                for (size_t i = 0; i < piece_list.size(); ++i) {
                    // Byte-level symbols back to the bytes they stand for (always valid: the
                    // pre-tokenizer produced them).
                    byte_level_decode(piece_list.view(i), raw);
                    raw_ends.push_back(raw.size());
                }
                raw_pieces.clear();
                size_t b = 0;
                for (size_t e : raw_ends) {
                    raw_pieces.emplace_back(raw.data() + b, e - b);
                    b = e;
                }
                sink.on_document(w, raw_pieces);
                ++batch.documents;
                batch.pieces += piece_list.size();
            }
            sink.on_batch_end(w);
            if (cancelled()) return cancelled_error("{}: cancelled", label);
            return ok_status();
        };
    };
    ScanTotals sum;
    auto write = [&](Batch& batch) -> Status {
        sum.documents += batch.documents;
        sum.skipped += batch.skipped;
        sum.pieces += batch.pieces;
        sum.input_bytes += batch.data.size();
        if (progress) progress->add(0, batch.documents);
        return ok_status();
    };
    LATHE_RETURN_IF_ERROR(ordered_parallel_map<Batch>(
        threads, make_worker, [&reader](Batch& b) { return reader.read(b); }, write));
    if (progress) progress->finish();
    totals = sum;
    return ok_status();
}

// ---- the shared candidate table -------------------------------------------------------------

// 64-bit hash of a key (core/hash.h): the low bits pick a table slot, the top 6 bits the shard.
uint64_t key_hash(std::string_view key) {
    return hash_bytes(key);
}

// key -> count, open addressing with linear probing over a power-of-two table kept at most half
// full; keys live back to back in one arena. A node-based std::unordered_map spent most of the
// counting time on cache misses and allocation (perf, GCIDE); this one touches one slot and the
// key bytes per lookup. Not thread-safe.
class FlatCounts {
public:
    FlatCounts() { slots_.resize(kInitialSlots); }

    size_t size() const { return size_; }

    // count[key] += n (n >= 1).
    void add(std::string_view key, uint64_t hash, uint64_t n) {
        if ((size_ + 1) * 2 > slots_.size()) grow();
        const size_t mask = slots_.size() - 1;
        for (size_t i = hash & mask;; i = (i + 1) & mask) {
            Slot& s = slots_[i];
            if (s.count == 0) {
                s = Slot{hash, n, arena_.size(), static_cast<uint32_t>(key.size())};
                arena_.append(key);
                ++size_;
                return;
            }
            if (s.hash == hash && s.len == key.size() &&
                std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
                s.count += n;
                return;
            }
        }
    }

    // f(key, hash, count) for every entry.
    template <typename F>
    void for_each(F&& f) const {
        for (const Slot& s : slots_) {
            if (s.count != 0) f(std::string_view(arena_.data() + s.offset, s.len), s.hash, s.count);
        }
    }

    // Empties the table, keeping its capacity (worker-local tables, once per batch).
    void clear() {
        if (size_ == 0) return;
        std::fill(slots_.begin(), slots_.end(), Slot{});
        arena_.clear();
        size_ = 0;
    }

    // Drops every entry with count < floor (rebuilds the table and compacts the arena).
    void keep_at_least(uint64_t floor) {
        FlatCounts kept;
        for_each([&](std::string_view k, uint64_t h, uint64_t c) {
            if (c >= floor) kept.add(k, h, c);
        });
        *this = std::move(kept);
    }

    void release() { *this = FlatCounts(); }

private:
    static constexpr size_t kInitialSlots = 1024;
    struct Slot {
        uint64_t hash = 0;
        uint64_t count = 0;  // 0 = empty
        uint64_t offset = 0;
        uint32_t len = 0;
    };

    void grow() {
        std::vector<Slot> old(slots_.size() * 2);
        old.swap(slots_);
        const size_t mask = slots_.size() - 1;
        for (const Slot& s : old) {
            if (s.count == 0) continue;
            size_t i = s.hash & mask;
            while (slots_[i].count != 0) i = (i + 1) & mask;
            slots_[i] = s;
        }
    }

    std::vector<Slot> slots_;
    std::string arena_;
    size_t size_ = 0;
};

class ShardedCounts {
public:
    explicit ShardedCounts(uint64_t max_entries)
        : max_entries_(std::max<uint64_t>(max_entries, 16)) {}

    // Adds a worker's local counts and empties `local`; prunes when the table grew too large.
    void merge(FlatCounts& local) {
        struct Item {
            std::string_view key;
            uint64_t hash;
            uint64_t count;
        };
        std::array<std::vector<Item>, kShards> by_shard;
        local.for_each([&](std::string_view k, uint64_t h, uint64_t c) {
            by_shard[h >> 58].push_back(Item{k, h, c});
        });
        static_assert(kShards == 64, "the shard is the hash's top 6 bits");
        for (size_t s = 0; s < kShards; ++s) {
            if (by_shard[s].empty()) continue;
            std::lock_guard<std::mutex> lock(shards_[s].mu);
            FlatCounts& table = shards_[s].table;
            const size_t before = table.size();
            for (const Item& it : by_shard[s]) table.add(it.key, it.hash, it.count);
            entries_ += table.size() - before;
        }
        local.clear();
        if (entries_.load() > max_entries_) prune();
    }

    // Every entry with count >= min_count; empties the table.
    std::vector<std::pair<std::string, uint64_t>> take(uint64_t min_count) {
        std::vector<std::pair<std::string, uint64_t>> out;
        for (auto& shard : shards_) {
            shard.table.for_each([&](std::string_view k, uint64_t, uint64_t c) {
                if (c >= min_count) out.emplace_back(std::string(k), c);
            });
            shard.table.release();
        }
        return out;
    }

    int pruned() const { return pruned_; }
    uint64_t prune_floor() const { return floor_; }

private:
    void prune() {
        std::lock_guard<std::mutex> prune_lock(prune_mu_);
        if (entries_.load() <= max_entries_) return;  // another thread pruned meanwhile
        std::vector<std::unique_lock<std::mutex>> locks;
        for (auto& shard : shards_) locks.emplace_back(shard.mu);
        uint64_t floor = std::max<uint64_t>(floor_, 2);
        for (;;) {
            uint64_t remaining = 0;
            for (auto& shard : shards_) {
                shard.table.keep_at_least(floor);
                remaining += shard.table.size();
            }
            entries_ = remaining;
            if (remaining <= max_entries_ / 2) break;
            floor *= 2;
        }
        floor_ = floor;
        ++pruned_;
        log_info("terms: candidate table pruned to {} entries (counts below {} dropped)",
                 entries_.load(), floor);
    }

    struct Shard {
        std::mutex mu;
        FlatCounts table;
    };
    uint64_t max_entries_;
    std::array<Shard, kShards> shards_;
    std::atomic<uint64_t> entries_{0};
    std::mutex prune_mu_;
    int pruned_ = 0;
    uint64_t floor_ = 0;
};

// ---- loading the source tokenizer's parts -------------------------------------------------

bool has_type(const nlohmann::json& node, std::string_view type) {
    if (node.is_object()) {
        auto t = node.find("type");
        if (t != node.end() && t->is_string() && t->get<std::string>() == type) return true;
        for (const auto& [k, v] : node.items()) {
            if (has_type(v, type)) return true;
        }
    } else if (node.is_array()) {
        for (const auto& v : node) {
            if (has_type(v, type)) return true;
        }
    }
    return false;
}

bool byte_level_adds_prefix_space(const nlohmann::json& node) {
    if (node.is_object()) {
        auto t = node.find("type");
        if (t != node.end() && t->is_string() && t->get<std::string>() == "ByteLevel") {
            return node.value("add_prefix_space", true);
        }
        for (const auto& [k, v] : node.items()) {
            if (byte_level_adds_prefix_space(v)) return true;
        }
    } else if (node.is_array()) {
        for (const auto& v : node) {
            if (byte_level_adds_prefix_space(v)) return true;
        }
    }
    return false;
}

Result<TextPipeline> load_pipeline(const nlohmann::json& tok, const std::string& path) {
    TextPipeline p;
    const auto pre = tok.find("pre_tokenizer");
    if (pre == tok.end() || pre->is_null() || !has_type(*pre, "ByteLevel")) {
        return unimplemented_error(
            "{}: align terms needs a byte-level BPE tokenizer (a pre_tokenizer with a ByteLevel "
            "step, as gpt2, gpt-neox, llama3 and qwen3 have); this one has none, so its words "
            "cannot be found",
            path);
    }
    if (byte_level_adds_prefix_space(*pre)) {
        return unimplemented_error(
            "{}: pre_tokenizer ByteLevel has add_prefix_space=true: HF would put a space before "
            "the text after every added term, so terms cannot be added as tokens sensibly",
            path);
    }
    LATHE_ASSIGN_OR_RETURN(p.pre_tokenizer, pre_tokenizer_from_json(pre->dump(), path));
    const auto norm = tok.find("normalizer");
    if (norm != tok.end() && !norm->is_null()) {
        LATHE_ASSIGN_OR_RETURN(p.normalizer, normalizer_from_json(norm->dump(), path));
    }
    return p;
}

std::string stem_of(const std::string& output) {
    std::string s = output;
    if (ends_with(s, ".json")) s.resize(s.size() - 5);
    return s;
}

// Inserts `entries` (JSON objects separated by commas, "" for none) at the end of the top-level
// "added_tokens" array of the tokenizer.json text `json`. A small scanner (strings, escapes,
// nesting) finds the array; the text was already parsed successfully, so it is valid JSON.
Result<std::string> splice_added_tokens(const std::string& json, const std::string& entries,
                                        const std::string& path) {
    if (entries.empty()) return json;
    int depth = 0;
    size_t i = 0;
    const size_t n = json.size();
    size_t array_open = std::string::npos;
    bool expect_key = false;
    while (i < n) {
        const char c = json[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
            const std::string_view str(json.data() + i + 1, j - i - 1);
            i = j + 1;
            if (depth == 1 && expect_key && str == "added_tokens") {
                while (i < n &&
                       (json[i] == ':' || is_ascii_space(static_cast<unsigned char>(json[i]))))
                    ++i;
                if (i < n && json[i] == '[') array_open = i;
                break;
            }
            expect_key = false;
            continue;
        }
        if (c == '{' || c == '[') {
            ++depth;
            expect_key = c == '{' && depth == 1;
        } else if (c == '}' || c == ']') {
            --depth;
        } else if (c == ',' && depth == 1) {
            expect_key = true;
        }
        ++i;
    }
    if (array_open == std::string::npos) {
        return invalid_argument_error("{}: no top-level \"added_tokens\" array", path);
    }
    // The matching ']' and whether the array has elements.
    int d = 0;
    bool has_elements = false;
    for (i = array_open; i < n; ++i) {
        const char c = json[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
            i = j;
            has_elements = true;
            continue;
        }
        if (c == '[' || c == '{') {
            if (d >= 1) has_elements = true;
            ++d;
        } else if (c == ']' || c == '}') {
            if (--d == 0) break;
        } else if (d >= 1 && !is_ascii_space(static_cast<unsigned char>(c))) {
            has_elements = true;
        }
    }
    if (i >= n) return invalid_argument_error("{}: unterminated \"added_tokens\" array", path);
    size_t close = i;
    // Insert after the last element (before the whitespace that precedes ']').
    size_t insert_at = close;
    while (insert_at > array_open + 1 &&
           is_ascii_space(static_cast<unsigned char>(json[insert_at - 1]))) {
        --insert_at;
    }
    std::string out;
    out.reserve(json.size() + entries.size() + 8);
    out.append(json, 0, insert_at);
    if (has_elements) out += ',';
    out += entries;
    out += "\n  ";
    out.append(json, close, std::string::npos);
    return out;
}

int resolve_threads(int threads) {
    if (threads > 0) return threads;
    return std::max(1u, std::thread::hardware_concurrency());
}

// The source tokenizer.json as JSON, with the "added_tokens" array the terms are spliced into.
Result<nlohmann::json> parse_source_json(const std::string& text, const std::string& path) {
    nlohmann::json tok = json_parse<nlohmann::json>(text);
    if (tok.is_discarded())
        return invalid_argument_error("{}: not valid JSON: {}", path, json_problem(text));
    if (!tok.is_object() || !tok.contains("added_tokens") || !tok["added_tokens"].is_array()) {
        return invalid_argument_error("{}: not a tokenizer.json (no \"added_tokens\" array)", path);
    }
    return tok;
}

}  // namespace

Status align_terms_check_tokenizer(const std::string& tokenizer_path) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(tokenizer_path));
    LATHE_ASSIGN_OR_RETURN(nlohmann::json tok, parse_source_json(text, tokenizer_path));
    return load_pipeline(tok, tokenizer_path).status();
}

const char* terms_format_name(TermsFormat format) {
    switch (format) {
        case TermsFormat::kAuto:
            return "auto";
        case TermsFormat::kText:
            return "text";
        case TermsFormat::kTextBlocks:
            return "text-blocks";
        case TermsFormat::kJsonl:
            return "jsonl";
    }
    return "?";
}

Result<TermsFormat> terms_format_from_name(std::string_view name) {
    for (TermsFormat f :
         {TermsFormat::kAuto, TermsFormat::kText, TermsFormat::kTextBlocks, TermsFormat::kJsonl}) {
        if (name == terms_format_name(f)) return f;
    }
    return invalid_argument_error(
        "unknown corpus format '{}': expected auto, text, text-blocks "
        "or jsonl",
        name);
}

bool terms_is_word(std::string_view p) {
    if (p.size() < 2 || p[0] != ' ') return false;
    for (size_t i = 1; i < p.size(); ++i) {
        if (is_ascii_space(static_cast<unsigned char>(p[i]))) return false;
    }
    return true;
}

bool terms_is_ngram_part(std::string_view p) {
    if (p.size() < 2 || p[0] != ' ') return false;
    for (size_t i = 1; i < p.size(); ++i) {
        const auto c = static_cast<unsigned char>(p[i]);
        const bool alnum =
            (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && c < 0x80) return false;
    }
    return true;
}

std::string align_terms_default_report(const std::string& output) {
    return stem_of(output) + ".terms.tsv";
}

std::string align_terms_tokenizer_config_path(const std::string& output) {
    const std::filesystem::path p(output);
    if (p.filename() == "tokenizer.json")
        return (p.parent_path() / "tokenizer_config.json").string();
    return stem_of(output) + ".tokenizer_config.json";
}

std::string align_terms_default_new_tokens(const std::string& output) {
    return stem_of(output) + ".new_tokens.json";
}

Result<TermsReport> align_terms_run(const TermsOptions& options) {
    const auto t_start = Clock::now();
    if (options.top_k < 1)
        return invalid_argument_error("--top-k must be at least 1 (got {})", options.top_k);
    if (options.min_count < 1) {
        return invalid_argument_error("--min-count must be at least 1 (got {})", options.min_count);
    }
    if (options.max_ngram < 1 || options.max_ngram > 3) {
        return invalid_argument_error("--max-ngram must be 1, 2 or 3 (got {})", options.max_ngram);
    }
    if (!(options.smoothing > 0.0)) {
        return invalid_argument_error("--smoothing must be positive (got {})", options.smoothing);
    }
    if (options.corpus.empty()) return invalid_argument_error("no domain corpus given (--corpus)");
    if (options.output.empty()) return invalid_argument_error("no output given (--output)");
    const std::string report_path =
        options.report.empty() ? align_terms_default_report(options.output) : options.report;
    const std::string new_tokens_path = options.new_tokens.empty()
                                            ? align_terms_default_new_tokens(options.output)
                                            : options.new_tokens;

    StageFingerprint fp("align terms");
    fp.add_setting("format", terms_format_name(options.format));
    fp.add_setting("json_key", options.json_key);
    fp.add_setting("top_k", options.top_k);
    fp.add_setting("min_count", options.min_count);
    fp.add_setting("max_ngram", options.max_ngram);
    fp.add_setting("smoothing", options.general_corpus.empty() ? 0.0 : options.smoothing);
    fp.add_setting("max_table_entries", options.max_table_entries);
    fp.add_setting("skip_bad_documents", options.skip_bad_documents);
    fp.add_setting("report", report_path);
    fp.add_setting("new_tokens", new_tokens_path);
    LATHE_RETURN_IF_ERROR(fp.add_input("source_tokenizer", options.source_tokenizer));
    // The source's tokenizer_config.json (chat template, special tokens), copied beside the target.
    const std::optional<std::string> source_config =
        prepare_find_tokenizer_config(options.source_tokenizer);
    const std::string target_config = align_terms_tokenizer_config_path(options.output);
    if (source_config.has_value()) {
        LATHE_RETURN_IF_ERROR(fp.add_input("source_tokenizer_config", *source_config));
    }
    for (size_t i = 0; i < options.corpus.size(); ++i) {
        LATHE_RETURN_IF_ERROR(fp.add_input(fmt::format("corpus[{}]", i), options.corpus[i]));
    }
    for (size_t i = 0; i < options.general_corpus.size(); ++i) {
        LATHE_RETURN_IF_ERROR(
            fp.add_input(fmt::format("general_corpus[{}]", i), options.general_corpus[i]));
    }
    TermsReport report;
    if (!options.force && stage_up_to_date(options.output, fp)) {
        report.skipped_up_to_date = true;
        report.outputs = {options.output, report_path, new_tokens_path};
        if (source_config.has_value()) report.outputs.push_back(target_config);
        return report;
    }

    // The source: lathe's tokenizer (for piece counts and the final check) and its JSON (for the
    // text pipeline and as the base of the target file).
    LATHE_ASSIGN_OR_RETURN(std::string source_text, file_read_all(options.source_tokenizer));
    LATHE_ASSIGN_OR_RETURN(nlohmann::json tok,
                           parse_source_json(source_text, options.source_tokenizer));
    LATHE_ASSIGN_OR_RETURN(Tokenizer source,
                           Tokenizer::from_json(source_text, options.source_tokenizer));
    LATHE_ASSIGN_OR_RETURN(TextPipeline pipeline, load_pipeline(tok, options.source_tokenizer));
    report.source_vocab_size = source.vocab_size();
    const int threads = resolve_threads(options.threads);

    // Pass 1: count candidates in the domain corpus.
    const auto t_count = Clock::now();
    ShardedCounts counts(options.max_table_entries);
    std::vector<FlatCounts> local(static_cast<size_t>(threads));
    ScanSink count_sink;
    count_sink.on_document = [&](int w, const std::vector<std::string_view>& pieces) {
        FlatCounts& t = local[static_cast<size_t>(w)];
        terms_emit_candidates(pieces, options.max_ngram,
                              [&](std::string_view key) { t.add(key, key_hash(key), 1); });
    };
    count_sink.on_batch_end = [&](int w) { counts.merge(local[static_cast<size_t>(w)]); };
    ScanTotals domain;
    LATHE_RETURN_IF_ERROR(scan_corpus(options.corpus, options, pipeline, threads, count_sink,
                                      "terms: counting", domain));
    report.count_seconds = seconds_since(t_count);
    report.documents = domain.documents;
    report.skipped = domain.skipped;
    report.pieces = domain.pieces;
    report.input_bytes = domain.input_bytes;
    report.pruned = counts.pruned();
    report.prune_floor = counts.prune_floor();
    if (domain.documents == 0) {
        return invalid_argument_error("the domain corpus ({}) holds no documents",
                                      fmt::join(options.corpus, ", "));
    }
    auto candidates = counts.take(static_cast<uint64_t>(options.min_count));
    report.candidates = candidates.size();
    log_info("terms: {} documents, {} pieces, {} candidates with count >= {}", domain.documents,
             domain.pieces, candidates.size(), options.min_count);

    // Pass 2 (optional): count the same candidates in the general corpus.
    std::vector<uint64_t> general_counts(candidates.size(), 0);
    if (!options.general_corpus.empty()) {
        CountTable index;  // term -> candidate index
        index.reserve(candidates.size());
        for (size_t i = 0; i < candidates.size(); ++i) index.emplace(candidates[i].first, i);
        std::vector<std::vector<uint64_t>> per_worker(static_cast<size_t>(threads),
                                                      std::vector<uint64_t>(candidates.size(), 0));
        ScanSink general_sink;
        general_sink.on_document = [&](int w, const std::vector<std::string_view>& pieces) {
            auto& c = per_worker[static_cast<size_t>(w)];
            terms_emit_candidates(pieces, options.max_ngram, [&](std::string_view key) {
                auto it = index.find(key);
                if (it != index.end()) ++c[it->second];
            });
        };
        general_sink.on_batch_end = [](int) {};
        ScanTotals general;
        LATHE_RETURN_IF_ERROR(scan_corpus(options.general_corpus, options, pipeline, threads,
                                          general_sink, "terms: general corpus", general));
        if (general.documents == 0 || general.pieces == 0) {
            return invalid_argument_error("the general corpus ({}) holds no words",
                                          fmt::join(options.general_corpus, ", "));
        }
        report.general_documents = general.documents;
        report.general_pieces = general.pieces;
        report.skipped += general.skipped;
        for (const auto& c : per_worker) {
            for (size_t i = 0; i < c.size(); ++i) general_counts[i] += c[i];
        }
    }

    // Score every candidate: its source encoding (in parallel; encode is thread-safe), in chunks
    // of kScoreChunk candidates.
    std::vector<Term> scored(candidates.size());
    {
        const double n_domain = static_cast<double>(domain.pieces);
        const double n_general = static_cast<double>(report.general_pieces);
        struct Chunk {
            size_t begin = 0;
            size_t end = 0;
        };
        size_t next = 0;
        auto read = [&](Chunk& c) -> Result<bool> {
            if (next == candidates.size()) return false;
            c.begin = next;
            c.end = std::min(candidates.size(), next + kScoreChunk);
            next = c.end;
            return true;
        };
        auto make_worker = [&] {
            return [&, ids = std::vector<int32_t>()](Chunk& c) mutable -> Status {
                for (size_t i = c.begin; i < c.end; ++i) {
                    Term& t = scored[i];
                    t.text = candidates[i].first;
                    t.count = candidates[i].second;
                    t.general_count = general_counts[i];
                    // Already a single token (in the model vocabulary or added): nothing to gain,
                    // and HF would give it the existing id rather than a new one.
                    if (source.token_to_id(t.text).has_value()) continue;
                    LATHE_RETURN_IF_ERROR(source.encode(t.text, /*add_special=*/false, ids));
                    if (ids.size() < 2) continue;
                    double score =
                        static_cast<double>(t.count) * static_cast<double>(ids.size() - 1);
                    if (!options.general_corpus.empty()) {
                        const double p_domain = static_cast<double>(t.count) / n_domain;
                        const double p_general =
                            (static_cast<double>(t.general_count) + options.smoothing) / n_general;
                        score *= std::log(p_domain / p_general);
                    }
                    t.source_ids = ids;
                    t.score = score;
                }
                return ok_status();
            };
        };
        LATHE_RETURN_IF_ERROR(ordered_parallel_map<Chunk>(threads, make_worker, read,
                                                          [](Chunk&) { return ok_status(); }));
    }
    std::erase_if(scored, [](const Term& t) { return t.source_ids.empty() || !(t.score > 0.0); });
    const size_t keep = std::min(scored.size(), static_cast<size_t>(options.top_k));
    std::partial_sort(scored.begin(), scored.begin() + static_cast<std::ptrdiff_t>(keep),
                      scored.end(), [](const Term& a, const Term& b) {
                          if (a.score != b.score) return a.score > b.score;
                          return a.text < b.text;
                      });
    scored.resize(keep);
    if (keep == 0) {
        log_warning(
            "terms: no candidate scored above 0 (min count {}, {} candidates): the target "
            "tokenizer equals the source",
            options.min_count, report.candidates);
    }
    for (size_t i = 0; i < scored.size(); ++i) {
        scored[i].id = report.source_vocab_size + static_cast<int32_t>(i);
    }

    // The target tokenizer.json: the source text with the terms appended to "added_tokens"
    // (spliced in as text, so everything else stays byte for byte as it was).
    std::string entries;
    for (const Term& t : scored) {
        nlohmann::ordered_json a;
        a["id"] = t.id;
        a["content"] = t.text;
        a["single_word"] = false;
        a["lstrip"] = false;
        a["rstrip"] = false;
        a["normalized"] = true;
        a["special"] = false;
        entries += entries.empty() ? "\n    " : ",\n    ";
        entries += a.dump();
    }
    LATHE_ASSIGN_OR_RETURN(const std::string target_text,
                           splice_added_tokens(source_text, entries, options.source_tokenizer));
    {
        // The check HF would make on load: every term gets exactly its id.
        LATHE_ASSIGN_OR_RETURN(Tokenizer target, Tokenizer::from_json(target_text, options.output));
        for (const Term& t : scored) {
            auto id = target.token_to_id(t.text);
            if (!id.has_value() || *id != t.id) {
                return internal_error("target tokenizer: term '{}' got id {} instead of {}",
                                      escape_for_message(t.text), id.value_or(-1), t.id);
            }
        }
        report.target_vocab_size = target.vocab_size();
        if (report.target_vocab_size !=
            report.source_vocab_size + static_cast<int32_t>(scored.size())) {
            return internal_error("target tokenizer: vocab size {} instead of {} + {}",
                                  report.target_vocab_size, report.source_vocab_size,
                                  scored.size());
        }
    }

    // The TSV report and the machine-readable list of new tokens (with their source pieces, which
    // stage 5 uses for the FVT initialisation).
    // Terms hold no tab, newline or carriage return (see the candidate rules), so the TSV carries
    // them unescaped: the first column is the added token's content exactly.
    std::string tsv = options.general_corpus.empty()
                          ? "term\tcount\tpieces\tscore\tid\n"
                          : "term\tcount\tpieces\tscore\tid\tgeneral_count\n";
    nlohmann::ordered_json nt;
    nt["source_tokenizer"] = options.source_tokenizer;
    nt["target_tokenizer"] = options.output;
    nt["source_vocab_size"] = report.source_vocab_size;
    nt["target_vocab_size"] = report.target_vocab_size;
    nt["tokens"] = nlohmann::ordered_json::array();
    for (const Term& t : scored) {
        tsv += fmt::format("{}\t{}\t{}\t{:.6g}\t{}", t.text, t.count, t.source_ids.size(), t.score,
                           t.id);
        if (!options.general_corpus.empty()) tsv += fmt::format("\t{}", t.general_count);
        tsv += "\n";
        nt["tokens"].push_back({{"id", t.id},
                                {"content", t.text},
                                {"count", t.count},
                                {"score", t.score},
                                {"source_ids", t.source_ids}});
    }
    for (const std::string& out : {options.output, report_path, new_tokens_path}) {
        const std::filesystem::path parent = std::filesystem::path(out).parent_path();
        std::error_code ec;
        if (!parent.empty() && !std::filesystem::create_directories(parent, ec) && ec) {
            return io_error("{}: cannot create the folder: {}", parent.string(), ec.message());
        }
    }
    LATHE_RETURN_IF_ERROR(file_write_atomic(report_path, tsv));
    LATHE_RETURN_IF_ERROR(file_write_atomic(new_tokens_path, nt.dump(1) + "\n"));
    report.outputs = {options.output, report_path, new_tokens_path};
    if (source_config.has_value()) {
        // Same settings, the terms added to added_tokens_decoder as transformers lists them.
        LATHE_ASSIGN_OR_RETURN(std::string config_text, file_read_all(*source_config));
        nlohmann::ordered_json cfg = json_parse<nlohmann::ordered_json>(config_text);
        if (cfg.is_discarded()) {
            return invalid_argument_error("{}: not valid JSON: {}", *source_config,
                                          json_problem(config_text));
        }
        if (!cfg.is_object())
            return invalid_argument_error("{}: not a JSON object", *source_config);
        if (!cfg.contains("added_tokens_decoder") || !cfg["added_tokens_decoder"].is_object()) {
            cfg["added_tokens_decoder"] = nlohmann::ordered_json::object();
        }
        for (const Term& t : scored) {
            cfg["added_tokens_decoder"][std::to_string(t.id)] = {
                {"content", t.text}, {"lstrip", false},      {"normalized", true},
                {"rstrip", false},   {"single_word", false}, {"special", false}};
        }
        LATHE_RETURN_IF_ERROR(file_write_atomic(target_config, cfg.dump(2) + "\n"));
        report.outputs.push_back(target_config);
    }
    LATHE_RETURN_IF_ERROR(file_write_atomic(options.output, target_text));
    LATHE_RETURN_IF_ERROR(stage_write_manifest(options.output, fp, report.outputs));
    report.terms = std::move(scored);
    report.seconds = seconds_since(t_start);
    return report;
}

}  // namespace lathe
