#include "tokenizer/bpe_train_files.h"

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "core/log.h"
#include "core/progress.h"
#include "core/strings.h"
#include "io/file.h"
#include "io/input.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

enum class InputFormat { kJsonl, kText, kTextBlocks };

// "auto": JSONL when the name says so (.jsonl, .ndjson, .json, optionally compressed), plain text
// with one document per line otherwise (stdin included).
InputFormat format_for(const std::string& path, const std::string& format) {
    if (format == "jsonl") return InputFormat::kJsonl;
    if (format == "text") return InputFormat::kText;
    if (format == "text-blocks") return InputFormat::kTextBlocks;
    std::string name = path;
    for (const char* ext : {".gz", ".zst", ".zstd"})
        if (ends_with(name, ext)) name.resize(name.size() - std::string_view(ext).size());
    for (const char* ext : {".jsonl", ".ndjson", ".json"})
        if (ends_with(name, ext)) return InputFormat::kJsonl;
    return InputFormat::kText;
}

// Reads the inputs one after the other and hands out their documents in batches of about
// kBatchBytes: lines, blank-line-separated blocks, or one JSON field per JSONL line.
class DocumentFeeder {
public:
    static constexpr size_t kBatchBytes = size_t{1} << 20;

    DocumentFeeder(std::vector<std::string> paths, std::string format, std::string json_key)
        : paths_(std::move(paths)), format_(std::move(format)), json_key_(std::move(json_key)) {}

    Result<bool> next(BpeDocumentBatch& batch) {
        while (true) {
            if (!stream_) {
                if (next_path_ == paths_.size()) return batch.size() > 0;
                if (batch.size() > 0) return true;  // a batch never spans two files
                LATHE_RETURN_IF_ERROR(open(paths_[next_path_++]));
            }
            batch.origin = stream_->name();
            LATHE_ASSIGN_OR_RETURN(const bool more, fill(batch));
            if (!more) {
                records_.reset();
                lines_.reset();
                stream_.reset();
                continue;
            }
            if (batch.text.size() >= kBatchBytes) return true;
        }
    }

private:
    Status open(const std::string& path) {
        LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(path));
        stream_ = std::make_unique<InputStream>(std::move(in));
        format_now_ = format_for(path, format_);
        if (format_now_ == InputFormat::kJsonl) {
            lines_ = std::make_unique<LineReader>(*stream_);
        } else {
            records_ = std::make_unique<TextRecordReader>(
                *stream_, format_now_ == InputFormat::kText ? TextRecordFormat::kLines
                                                            : TextRecordFormat::kBlocks);
        }
        log_debug("reading {} as {}", stream_->name(),
                  format_now_ == InputFormat::kJsonl ? "JSONL" : "text");
        return ok_status();
    }

    // Adds documents of the current input to `batch` until it holds kBatchBytes; returns false
    // when the input is exhausted.
    Result<bool> fill(BpeDocumentBatch& batch) {
        while (batch.text.size() < kBatchBytes) {
            if (format_now_ != InputFormat::kJsonl) {
                TextRecord record;
                LATHE_ASSIGN_OR_RETURN(const bool more, records_->next(record));
                if (!more) return false;
                // A blank line is never a document (as in `lathe prepare`).
                if (is_blank_line(record.text)) continue;
                add(batch, record.text, record.line);
                continue;
            }
            std::string_view line;
            LATHE_ASSIGN_OR_RETURN(const bool more, lines_->next(line));
            if (!more) return false;
            if (is_blank_line(line)) continue;
            LATHE_RETURN_IF_ERROR(add_json(batch, line, lines_->line_number()));
        }
        return true;
    }

    void add(BpeDocumentBatch& batch, std::string_view text, uint64_t line) {
        batch.text.append(text);
        batch.ends.push_back(batch.text.size());
        batch.lines.push_back(line);
    }

    Status add_json(BpeDocumentBatch& batch, std::string_view line, uint64_t line_number) {
        const std::string where = fmt::format("{}:{}", stream_->name(), line_number);
        simdjson::dom::element root;
        if (auto error = parser_.parse(line.data(), line.size(), true).get(root))
            return invalid_argument_error("{}: not valid JSON ({}); each line must be one object",
                                          where, simdjson::error_message(error));
        simdjson::dom::object object;
        if (root.get(object))
            return invalid_argument_error("{}: expected a JSON object, found {}", where,
                                          escape_for_message(line, 60));
        simdjson::dom::element field;
        if (object[json_key_].get(field)) {
            std::vector<std::string> keys;
            for (auto kv : object) keys.emplace_back(kv.key);
            return invalid_argument_error(
                "{}: no field '{}'{}; name the text field with --json-key", where, json_key_,
                did_you_mean(json_key_, keys));
        }
        std::string_view text;
        if (field.get(text))
            return invalid_argument_error("{}: field '{}' is not a string", where, json_key_);
        add(batch, text, line_number);
        return ok_status();
    }

    std::vector<std::string> paths_;
    std::string format_;
    std::string json_key_;
    size_t next_path_ = 0;
    std::unique_ptr<InputStream> stream_;
    std::unique_ptr<TextRecordReader> records_;
    std::unique_ptr<LineReader> lines_;
    InputFormat format_now_ = InputFormat::kText;
    simdjson::dom::parser parser_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Status bpe_train_files(const BpeTrainFilesOptions& args) {
    if (args.inputs.empty()) return invalid_argument_error("--input: give at least one file");
    const int threads =
        args.threads > 0 ? args.threads : std::max(1, int(std::thread::hardware_concurrency()));
    LATHE_ASSIGN_OR_RETURN(const BpePreTokenizerKind kind,
                           bpe_pre_tokenizer_kind_from_name(args.pre_tokenizer));
    for (const std::string& t : args.special_tokens)
        if (t.empty())
            return invalid_argument_error(
                "--special-tokens: an empty name (two commas in a row, or a trailing comma)");
    if (args.on_error != "fail" && args.on_error != "skip")
        return invalid_argument_error("--on-error: expected fail or skip, got '{}'", args.on_error);
    const BpeOnError on_error = args.on_error == "skip" ? BpeOnError::kSkip : BpeOnError::kFail;
    if (args.format != "auto" && args.format != "jsonl" && args.format != "text" &&
        args.format != "text-blocks")
        return invalid_argument_error(
            "--format: unknown format '{}'; expected auto, jsonl, text or text-blocks",
            args.format);

    // Words are counted with the very pre-tokenizer the output file will carry, built through
    // the same factory the encoder uses, so training sees exactly the splits encoding makes.
    const std::string pre_tokenizer_json = bpe_pre_tokenizer_json(kind);
    LATHE_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> pre_tokenizer,
                           pre_tokenizer_from_json(pre_tokenizer_json, "--pre-tokenizer"));

    // Check the options before reading the corpus: the trainer refuses a too small vocabulary.
    BpeTrainerOptions options;
    options.vocab_size = args.vocab_size;
    options.min_frequency = args.min_frequency;
    options.special_tokens = args.special_tokens;
    options.threads = threads;
    LATHE_RETURN_IF_ERROR(bpe_train(WordCounts(1), options).status());
    // Fail on an unwritable output before the work, not after it.
    LATHE_RETURN_IF_ERROR(AtomicFile::create(args.output).status());

    const auto t0 = std::chrono::steady_clock::now();
    DocumentFeeder feeder(args.inputs, args.format, args.json_key);
    std::optional<Progress> progress;
    if (args.show_progress) progress.emplace("tokenizer train: counting words", 0, "docs");
    BpeCountStats stats;
    LATHE_ASSIGN_OR_RETURN(
        WordCounts words,
        bpe_count_words(
            *pre_tokenizer, [&feeder](BpeDocumentBatch& b) { return feeder.next(b); }, threads,
            on_error, progress ? &*progress : nullptr, &stats));
    if (progress) progress->finish();
    const double count_s = seconds_since(t0);
    log_info("counted {} words ({} distinct) in {} documents, {} in {:.2f} s on {} thread(s)",
             words.total(), words.size(), stats.documents,
             Progress::format_bytes(double(stats.bytes)), count_s, threads);
    if (stats.skipped > 0)
        log_warning(
            "skipped {} document(s) that are not valid UTF-8 or that the pre-tokenizer's pattern "
            "gave up on (the first at {})",
            stats.skipped, stats.first_skipped);

    const auto t1 = std::chrono::steady_clock::now();
    LATHE_ASSIGN_OR_RETURN(BpeTrainerResult result, bpe_train(words, options));
    const double train_s = seconds_since(t1);
    const size_t special_count =
        std::set<int32_t>(result.special_ids.begin(), result.special_ids.end()).size();
    log_info("learned {} merges in {:.2f} s: vocabulary {} ({} special, 256 bytes); stopped: {}",
             result.merges.size(), train_s, result.vocab.size(), special_count,
             bpe_stop_reason_name(result.stop_reason));
    if (result.stop_reason != BpeStopReason::kVocabSizeReached)
        log_warning("the vocabulary has {} entries, fewer than the {} asked for ({}): {}",
                    result.vocab.size(), args.vocab_size, bpe_stop_reason_name(result.stop_reason),
                    result.stop_reason == BpeStopReason::kMinFrequency
                        ? "lower --min-frequency or give more text"
                        : "the corpus has no more pairs to merge; give more text");

    const std::string json = bpe_trainer_tokenizer_json(result, kind);
    // The file must load in lathe's own encoder (and so encode as HF does) before it is written.
    LATHE_RETURN_IF_ERROR(
        Tokenizer::from_json(json, args.output)
            .status()
            .with_context("the trained tokenizer does not load (a bug: please report it)"));
    LATHE_RETURN_IF_ERROR(file_write_atomic(args.output, json));
    log_info("wrote {} ({}) in {:.2f} s", args.output, Progress::format_bytes(double(json.size())),
             seconds_since(t0));
    return ok_status();
}

}  // namespace lathe
