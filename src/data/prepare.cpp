#include "data/prepare.h"

#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "core/ordered_pool.h"
#include "core/progress.h"
#include "core/strings.h"
#include "data/jsonl.h"
#include "io/file.h"
#include "io/input.h"
#include "io/json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace lathe {

const char* prepare_format_name(PrepareFormat format) {
    switch (format) {
        case PrepareFormat::kAuto:
            return "auto";
        case PrepareFormat::kJsonl:
            return "jsonl";
        case PrepareFormat::kText:
            return "text";
        case PrepareFormat::kTextBlocks:
            return "text-blocks";
        case PrepareFormat::kChat:
            return "chat";
        case PrepareFormat::kAlpaca:
            return "alpaca";
        case PrepareFormat::kSharegpt:
            return "sharegpt";
    }
    return "?";
}

bool prepare_format_is_conversation(PrepareFormat format) {
    return format == PrepareFormat::kChat || format == PrepareFormat::kAlpaca ||
           format == PrepareFormat::kSharegpt;
}

Result<PrepareFormat> prepare_format_from_name(std::string_view name) {
    for (PrepareFormat f : {PrepareFormat::kAuto, PrepareFormat::kJsonl, PrepareFormat::kText,
                            PrepareFormat::kTextBlocks, PrepareFormat::kChat,
                            PrepareFormat::kAlpaca, PrepareFormat::kSharegpt}) {
        if (name == prepare_format_name(f)) return f;
    }
    return invalid_argument_error(
        "unknown input format '{}': expected auto, jsonl, text, text-blocks, chat, alpaca or "
        "sharegpt",
        name);
}

std::optional<std::string> prepare_find_tokenizer_config(const std::string& tokenizer_path) {
    const std::filesystem::path p(tokenizer_path);
    const std::filesystem::path dir = p.parent_path();
    std::string stem = p.filename().string();
    if (ends_with(stem, ".json")) stem.resize(stem.size() - 5);
    for (const std::filesystem::path& candidate :
         {dir / (stem + ".tokenizer_config.json"), dir / "tokenizer_config.json"}) {
        if (file_exists(candidate.string())) return candidate.string();
    }
    return std::nullopt;
}

namespace {

// A token given in tokenizer_config.json as a string or as an AddedToken dict.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
    const auto it = config.find(key);
    if (it == config.end()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object()) {
        const auto c = it->find("content");
        if (c != it->end() && c->is_string()) return c->get<std::string>();
    }
    return std::nullopt;
}

}  // namespace

Result<EodChoice> prepare_resolve_eod(const Tokenizer& tokenizer, const std::string& tokenizer_path,
                                      const std::optional<std::string>& eod_token) {
    if (eod_token.has_value()) {
        const auto id = tokenizer.token_to_id(*eod_token);
        if (!id.has_value()) {
            return invalid_argument_error("--eod-token '{}' is not a token of {}",
                                          escape_for_message(*eod_token), tokenizer_path);
        }
        return EodChoice{*id, *eod_token, "--eod-token"};
    }
    constexpr const char* kNeoxEod = "<|endoftext|>";
    if (const auto id = tokenizer.token_to_id(kNeoxEod)) {
        return EodChoice{*id, kNeoxEod, "the tokenizer's <|endoftext|>, as GPT-NeoX's HFTokenizer"};
    }
    const std::optional<std::string> config_path = prepare_find_tokenizer_config(tokenizer_path);
    std::string why = "no tokenizer_config.json beside it";
    if (config_path.has_value()) {
        LATHE_ASSIGN_OR_RETURN(const std::string text, file_read_all(*config_path));
        const nlohmann::json config = json_parse<nlohmann::json>(text);
        if (config.is_discarded() || !config.is_object()) {
            return invalid_argument_error("{}: not a JSON object (looking for eos_token)",
                                          *config_path);
        }
        const std::optional<std::string> eos = config_token(config, "eos_token");
        if (eos.has_value()) {
            if (const auto id = tokenizer.token_to_id(*eos)) {
                return EodChoice{*id, *eos, "eos_token of " + *config_path};
            }
            why = fmt::format("{}'s eos_token '{}' is not in its vocabulary", *config_path,
                              escape_for_message(*eos));
        } else {
            why = *config_path + " has no eos_token";
        }
    }
    return invalid_argument_error(
        "--append-eod: {} has no <|endoftext|> token and {}; pass --eod-token TOKEN to choose the "
        "end-of-document token",
        tokenizer_path, why);
}

namespace {

constexpr size_t kBatchMaxRecords = 8192;
constexpr size_t kMaxSkipExamples = 10;
constexpr size_t kMaxPeekLines = 1000;

// How one input's records are read and turned into documents.
enum class RecordKind { kJsonl, kText, kBlocks, kChat, kAlpaca, kSharegpt };

// One input: a stream, its record reader, and lines looked at for format detection that are
// still to be handed out as records.
class Source {
public:
    static Result<std::unique_ptr<Source>> open(const std::string& path,
                                                const std::atomic<bool>* cancel,
                                                size_t max_record_bytes) {
        LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(path, InputOptions{cancel}));
        auto s = std::unique_ptr<Source>(new Source(std::move(in)));
        s->max_record_bytes_ = max_record_bytes;
        s->lines_ = std::make_unique<LineReader>(s->in_, max_record_bytes);
        return s;
    }

    // The first non-blank line (leading blank lines are kept as records too), or nullopt when the
    // input has none within kMaxPeekLines lines. Only before set_blocks() / next().
    Result<std::optional<std::string>> peek_first_content_line() {
        if (peeked_) return peek_result_;
        std::string_view line;
        while (pending_.size() < kMaxPeekLines) {
            LATHE_ASSIGN_OR_RETURN(const bool more, lines_->next(line));
            if (!more) break;
            pending_.push_back({std::string(strip_cr(line)), lines_->line_number()});
            if (!is_blank_line(line)) {
                peek_result_ = pending_.back().first;
                break;
            }
        }
        peeked_ = true;
        return peek_result_;
    }

    // Reads the whole input as one JSON array whose elements are the records (after
    // peek_first_content_line found '['). Each record's line is its index in the array.
    Status set_json_array(const std::string& name) {
        std::string all;
        for (const auto& [text, line] : pending_) {
            all += text;
            all += '\n';
        }
        pending_.clear();
        std::string_view line;
        while (true) {
            LATHE_ASSIGN_OR_RETURN(const bool more, lines_->next(line));
            if (!more) break;
            all.append(line);
            all += '\n';
        }
        array_ = json_parse<nlohmann::ordered_json>(all);
        if (array_.is_discarded()) {
            return invalid_argument_error(
                "{}: starts with '[' but is not valid JSON ({}); give one JSON array of records, "
                "or JSONL with one record per line",
                name, json_problem(all));
        }
        if (!array_.is_array()) {
            return invalid_argument_error("{}: expected one JSON array of records", name);
        }
        is_array_ = true;
        return ok_status();
    }

    bool is_array() const { return is_array_; }

    // Reads blank-line-separated blocks from now on (nothing may have been peeked).
    void set_blocks() {
        lines_.reset();
        blocks_ =
            std::make_unique<TextRecordReader>(in_, TextRecordFormat::kBlocks, max_record_bytes_);
    }

    Result<bool> next(TextRecord& rec) {
        if (blocks_) return blocks_->next(rec);
        if (is_array_) {
            if (array_index_ == array_.size()) return false;
            nlohmann::ordered_json& element = array_[array_index_];
            // The parse checked the UTF-8; the element's text is released once written out.
            current_.first = element.dump(-1, ' ', false);
            element = nullptr;
            rec.text = current_.first;
            rec.line = array_index_++;
            return true;
        }
        if (!pending_.empty()) {
            current_ = std::move(pending_.front());
            pending_.pop_front();
            rec.text = current_.first;
            rec.line = current_.second;
            return true;
        }
        std::string_view line;
        LATHE_ASSIGN_OR_RETURN(const bool more, lines_->next(line));
        if (!more) return false;
        rec.text = strip_cr(line);
        rec.line = lines_->line_number();
        return true;
    }

    InputStream& stream() { return in_; }

private:
    explicit Source(InputStream in) : in_(std::move(in)) {}
    InputStream in_;
    size_t max_record_bytes_ = 0;
    std::unique_ptr<LineReader> lines_;
    std::unique_ptr<TextRecordReader> blocks_;
    std::deque<std::pair<std::string, uint64_t>> pending_;
    std::pair<std::string, uint64_t> current_;
    bool peeked_ = false;
    std::optional<std::string> peek_result_;
    bool is_array_ = false;
    nlohmann::ordered_json array_;  // a JSON array input, read whole
    size_t array_index_ = 0;
};

struct RecordRef {
    size_t offset = 0;
    size_t size = 0;
    uint64_t line = 0;
};

// Records of one input, read on the calling thread, and once a worker has tokenized them, their
// documents (or the problems of the records that make none).
struct Batch {
    size_t input = 0;
    RecordKind kind = RecordKind::kText;
    bool json_array = false;  // records are elements of a JSON array; RecordRef::line is the index
    std::string text;         // the records' bytes back to back
    std::vector<RecordRef> records;
    Status read_error;  // the input failed after these records: the run stops here

    std::vector<int32_t> tokens;
    std::vector<int32_t> labels;  // chat only
    std::vector<uint64_t> doc_sizes;
    std::vector<std::string> errors;      // "file:line: problem", in record order
    std::vector<RecordProblem> problems;  // why, for each of `errors`

    // Empties the batch and keeps its buffers for the next one.
    void clear() {
        text.clear();
        records.clear();
        read_error = ok_status();
        tokens.clear();
        labels.clear();
        doc_sizes.clear();
        errors.clear();
        problems.clear();
    }
};

// What the reader and the workers share (read-only while the workers run).
struct Shared {
    const PrepareOptions& options;
    const Tokenizer& tokenizer;
    const ChatTemplate* chat = nullptr;
    std::optional<int32_t> eod_id;
    std::string json_key;
    bool run_is_chat = false;
    std::vector<std::string> display_names;  // per input, for messages

    Shared(const PrepareOptions& o, const Tokenizer& t) : options(o), tokenizer(t) {}
};

// "an object", "a string", ... for a parsed JSON value.
std::string json_kind(const nlohmann::ordered_json& v) {
    if (v.is_null()) return "null";
    const std::string name = v.type_name();
    const bool vowel = name[0] == 'a' || name[0] == 'o';
    return (vowel ? "an " : "a ") + name;
}

bool starts_like_json_object(std::string_view line) {
    for (char c : line) {
        if (c == ' ' || c == '\t' || c == '\r') continue;
        return c == '{';
    }
    return false;
}

// Decides how input `index` is read. Fails for an input that looks like chat data in a plain run.
Result<RecordKind> resolve_kind(const Shared& sh, size_t index, Source& source) {
    switch (sh.options.format) {
        case PrepareFormat::kJsonl:
            return RecordKind::kJsonl;
        case PrepareFormat::kText:
            return RecordKind::kText;
        case PrepareFormat::kTextBlocks:
            source.set_blocks();
            return RecordKind::kBlocks;
        case PrepareFormat::kChat:
        case PrepareFormat::kAlpaca:
        case PrepareFormat::kSharegpt: {
            LATHE_ASSIGN_OR_RETURN(const std::optional<std::string> first,
                                   source.peek_first_content_line());
            if (first.has_value()) {
                const size_t at = first->find_first_not_of(" \t\r\v\f");
                if (at != std::string::npos && (*first)[at] == '[')
                    LATHE_RETURN_IF_ERROR(source.set_json_array(sh.display_names[index]));
            }
            return sh.options.format == PrepareFormat::kChat     ? RecordKind::kChat
                   : sh.options.format == PrepareFormat::kAlpaca ? RecordKind::kAlpaca
                                                                 : RecordKind::kSharegpt;
        }
        case PrepareFormat::kAuto:
            break;
    }
    LATHE_ASSIGN_OR_RETURN(const std::optional<std::string> first,
                           source.peek_first_content_line());
    if (!first.has_value() || !starts_like_json_object(*first)) {
        if (sh.run_is_chat) {
            return invalid_argument_error(
                "{}: does not look like JSONL (its first line does not start with '{{'), but the "
                "run holds chat data (decided by the first input)",
                sh.display_names[index]);
        }
        return RecordKind::kText;
    }
    if (sh.run_is_chat) return RecordKind::kChat;
    JsonlFieldReader probe(sh.json_key);
    if (!sh.options.json_key.has_value() && !probe.has_field(*first, sh.json_key) &&
        probe.has_field(*first, "messages")) {
        return invalid_argument_error(
            "{}: looks like chat data (a \"messages\" field, no \"{}\"), but the first input "
            "made this a plain-text run; prepare chat and plain inputs separately, or pass "
            "--format chat",
            sh.display_names[index], sh.json_key);
    }
    return RecordKind::kJsonl;
}

// Cuts the inputs into batches, in order, on the calling thread. An input that cannot be opened
// or read ends the run after the batches before it: its batch carries the error.
class BatchReader {
public:
    BatchReader(const Shared& sh, std::unique_ptr<Source> first, Progress* progress)
        : sh_(sh), source_(std::move(first)), progress_(progress) {}

    Result<bool> read(Batch& b) {
        b.clear();
        while (!done_) {
            if (sh_.options.cancel != nullptr && sh_.options.cancel->load()) {
                return cancelled_error("interrupted; nothing was written under {}",
                                       sh_.options.output_prefix);
            }
            if (input_ == sh_.options.inputs.size()) {
                done_ = true;
                break;
            }
            b.input = input_;
            if (!kind_.has_value()) {
                if (!source_) {
                    auto opened = Source::open(sh_.options.inputs[input_], sh_.options.cancel,
                                               sh_.options.max_record_bytes);
                    if (!opened.ok()) return fail(b, opened.status());
                    source_ = std::move(*opened);
                }
                auto kind = resolve_kind(sh_, input_, *source_);
                if (!kind.ok()) return fail(b, kind.status());
                kind_ = *kind;
                raw_reported_ = 0;
            }
            b.kind = *kind_;
            b.json_array = source_->is_array();
            bool input_done = false;
            TextRecord rec;
            while (b.text.size() < sh_.options.batch_bytes && b.records.size() < kBatchMaxRecords) {
                auto more = source_->next(rec);
                if (!more.ok()) {
                    b.read_error = more.status();
                    break;
                }
                if (!*more) {
                    input_done = true;
                    break;
                }
                // A blank line is never a document: it separates blocks in text-blocks, and is
                // passed over in text, JSONL and chat input (as `tokenizer train` does).
                if (*kind_ != RecordKind::kBlocks && is_blank_line(rec.text)) {
                    ++blank_lines_;
                    continue;
                }
                b.records.push_back({b.text.size(), rec.text.size(), rec.line});
                b.text.append(rec.text);
            }
            if (progress_ != nullptr) {
                const uint64_t raw = source_->stream().raw_bytes_read();
                progress_->add(raw - raw_reported_, 0);
                raw_reported_ = raw;
            }
            if (!b.read_error.ok()) {
                finish_input();
                done_ = true;
                return true;
            }
            if (input_done) {
                finish_input();
                ++input_;
            }
            if (!b.records.empty()) return true;
        }
        return false;
    }

    uint64_t input_bytes() const { return input_bytes_; }
    uint64_t raw_bytes() const { return raw_bytes_; }
    uint64_t blank_lines() const { return blank_lines_; }

private:
    // A batch with no records that ends the run with `s`.
    Result<bool> fail(Batch& b, Status s) {
        b.read_error = std::move(s);
        done_ = true;
        return true;
    }

    void finish_input() {
        input_bytes_ += source_->stream().bytes_read();
        raw_bytes_ += source_->stream().raw_bytes_read();
        source_.reset();
        kind_.reset();
    }

    const Shared& sh_;
    std::unique_ptr<Source>
        source_;  // the input being read (the first one is opened by the caller)
    Progress* progress_;
    size_t input_ = 0;
    std::optional<RecordKind> kind_;  // set once the current input is opened and its kind decided
    uint64_t raw_reported_ = 0;
    bool done_ = false;
    uint64_t input_bytes_ = 0;
    uint64_t raw_bytes_ = 0;
    uint64_t blank_lines_ = 0;  // blank lines that were not documents
};

// Per-thread state of a worker.
struct Worker {
    const Shared& sh;
    JsonlFieldReader jsonl;
    std::vector<int32_t> ids;
    ChatEncodeOptions chat_options;
    nlohmann::ordered_json mapped;  // an alpaca or sharegpt record's messages

    explicit Worker(const Shared& s) : sh(s), jsonl(s.json_key) {
        chat_options.generation_role = s.options.generation_role;
        chat_options.only_last_turn = s.options.only_last_turn;
    }

    // Appends the record's document to `out`, or returns the problem (without file:line).
    // `line` may be moved forward to the line of the problem inside a block.
    Status encode_text(RecordKind kind, std::string_view text, uint64_t& line, Batch& out,
                       RecordProblem& problem) {
        problem = RecordProblem::kText;
        if (kind == RecordKind::kJsonl) {
            Result<std::string_view> field = jsonl.extract(text);
            if (!field.ok()) {
                // The reader's messages (data/jsonl.h) say which problem it is.
                const std::string_view m = field.status().message();
                problem = starts_with(m, "not valid JSON") ? RecordProblem::kNotJson
                          : starts_with(m, "no \"")        ? RecordProblem::kMissingField
                          : starts_with(m, "field \"") || starts_with(m, "expected a JSON object")
                              ? RecordProblem::kWrongType
                          : starts_with(m, "empty line") ? RecordProblem::kEmpty
                                                         : RecordProblem::kText;
                return field.status();
            }
            text = *field;
            if (text.empty()) {
                problem = RecordProblem::kEmpty;
                return invalid_argument_error("empty document (field \"{}\" is \"\")", sh.json_key);
            }
        } else {
            if (text.empty()) {
                problem = RecordProblem::kEmpty;
                return invalid_argument_error("empty document");
            }
            if (!simdjson::validate_utf8(text.data(), text.size())) {
                const std::optional<utf8::InvalidAt> bad = utf8::find_invalid(text);
                LATHE_CHECK(bad.has_value(), "simdjson and utf8::first_invalid disagree");
                line += bad->line - 1;
                return invalid_argument_error(
                    "invalid UTF-8 at byte column {} (byte 0x{:02x}); the input must be UTF-8",
                    bad->column, bad->byte);
            }
        }
        if (Status s = sh.tokenizer.encode(text, /*add_special=*/true, ids); !s.ok()) {
            return invalid_argument_error("tokenizer: {}", s.message());
        }
        if (ids.empty()) {
            problem = RecordProblem::kEmpty;
            return invalid_argument_error("the document encodes to no tokens");
        }
        out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
        if (sh.eod_id.has_value()) out.tokens.push_back(*sh.eod_id);
        out.doc_sizes.push_back(ids.size() + (sh.eod_id.has_value() ? 1 : 0));
        return ok_status();
    }

    // A conversation record (chat, alpaca or sharegpt) through the chat template.
    Status encode_chat(RecordKind kind, std::string_view text, Batch& out, RecordProblem& problem) {
        problem = RecordProblem::kEmpty;
        if (is_blank_line(text)) {
            return invalid_argument_error("empty line, expected a JSON object with a \"{}\" field",
                                          sh.json_key);
        }
        problem = RecordProblem::kNotJson;
        nlohmann::ordered_json record = json_parse<nlohmann::ordered_json>(text);
        if (record.is_discarded())
            return invalid_argument_error("not valid JSON: {}", json_problem(text));
        if (!record.is_object()) {
            problem = RecordProblem::kWrongType;
            if (kind == RecordKind::kAlpaca) {
                return invalid_argument_error(
                    "expected a JSON object with \"instruction\" and \"output\", found {}",
                    json_kind(record));
            }
            return invalid_argument_error("expected a JSON object with a \"{}\" field, found {}",
                                          sh.json_key, json_kind(record));
        }
        if (kind == RecordKind::kAlpaca) {
            LATHE_RETURN_IF_ERROR(alpaca_to_messages(record, mapped, problem));
            return encode_messages(mapped, out, problem);
        }
        if (kind == RecordKind::kSharegpt) {
            LATHE_RETURN_IF_ERROR(sharegpt_to_messages(record, sh.json_key,
                                                       sh.options.sharegpt_tags, mapped, problem));
            return encode_messages(mapped, out, problem);
        }
        const auto it = record.find(sh.json_key);
        if (it == record.end()) {
            std::string keys;
            for (const auto& [k, v] : record.items())
                keys += (keys.empty() ? "\"" : ", \"") + k + "\"";
            problem = RecordProblem::kMissingField;
            return invalid_argument_error("no \"{}\" field (the object has {})", sh.json_key,
                                          keys.empty() ? std::string("no keys") : "keys " + keys);
        }
        if (!it->is_array()) {
            problem = RecordProblem::kWrongType;
            return invalid_argument_error("field \"{}\" is {}, expected an array of messages",
                                          sh.json_key, json_kind(*it));
        }
        if (it->empty()) {
            problem = RecordProblem::kEmpty;
            return invalid_argument_error("empty conversation (\"{}\" is [])", sh.json_key);
        }
        return encode_messages(*it, out, problem);
    }

    // Messages through the chat template into `out`: ids, labels and the document's size.
    Status encode_messages(const nlohmann::ordered_json& messages, Batch& out,
                           RecordProblem& problem) {
        auto enc = sh.chat->encode_with_labels(sh.tokenizer, messages, chat_options);
        if (!enc.ok()) {
            problem = RecordProblem::kTemplate;
            return invalid_argument_error("chat template: {}", enc.status().message());
        }
        if (enc->ids.empty()) {
            problem = RecordProblem::kEmpty;
            return invalid_argument_error("the conversation encodes to no tokens");
        }
        if (sh.options.max_tokens > 0 && int64_t(enc->ids.size()) > sh.options.max_tokens) {
            problem = RecordProblem::kTooLong;
            return invalid_argument_error(
                "the conversation has {} tokens, more than --seq-length {}", enc->ids.size(),
                sh.options.max_tokens);
        }
        out.tokens.insert(out.tokens.end(), enc->ids.begin(), enc->ids.end());
        out.labels.insert(out.labels.end(), enc->labels.begin(), enc->labels.end());
        out.doc_sizes.push_back(enc->ids.size());
        return ok_status();
    }

    // Tokenizes the batch's records; a record that makes no document adds to b.errors.
    Status operator()(Batch& b) {
        for (const RecordRef& r : b.records) {
            const std::string_view text(b.text.data() + r.offset, r.size);
            uint64_t line = r.line;
            RecordProblem problem = RecordProblem::kText;
            const bool conversation = b.kind == RecordKind::kChat ||
                                      b.kind == RecordKind::kAlpaca ||
                                      b.kind == RecordKind::kSharegpt;
            Status s = conversation ? encode_chat(b.kind, text, b, problem)
                                    : encode_text(b.kind, text, line, b, problem);
            if (!s.ok()) {
                b.errors.push_back(
                    b.json_array
                        ? fmt::format("{}[{}]: {}", sh.display_names[b.input], line, s.message())
                        : fmt::format("{}:{}: {}", sh.display_names[b.input], line, s.message()));
                b.problems.push_back(problem);
            }
        }
        return ok_status();
    }
};

}  // namespace

Result<PrepareReport> prepare_run(const PrepareOptions& options) {
    const auto t0 = std::chrono::steady_clock::now();
    if (options.inputs.empty()) return invalid_argument_error("no --input given");
    if (options.output_prefix.empty()) return invalid_argument_error("no --output-prefix given");
    if (std::count(options.inputs.begin(), options.inputs.end(), std::string(kStdinPath)) > 1) {
        return invalid_argument_error(
            "stdin ('-') can be read only once, but is given {} times",
            std::count(options.inputs.begin(), options.inputs.end(), std::string(kStdinPath)));
    }
    // Missing inputs are reported before any work starts.
    uint64_t total_raw = 0;
    bool total_known = true;
    for (const std::string& path : options.inputs) {
        if (path == kStdinPath) {
            total_known = false;
            continue;
        }
        LATHE_ASSIGN_OR_RETURN(const uint64_t size, file_size(path));
        total_raw += size;
    }
    const std::string out_dir = std::filesystem::path(options.output_prefix).parent_path().string();
    if (!out_dir.empty() && !std::filesystem::is_directory(out_dir)) {
        return not_found_error("--output-prefix {}: the folder {} does not exist",
                               options.output_prefix, out_dir);
    }

    Result<Tokenizer> loaded = Tokenizer::load(options.tokenizer_path);
    if (!loaded.ok()) return loaded.status().with_context("--tokenizer");
    const Tokenizer tokenizer = std::move(loaded).value();
    PrepareReport report;
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    report.threads = options.threads > 0 ? options.threads : hw;

    Shared sh(options, tokenizer);
    for (const std::string& path : options.inputs) {
        sh.display_names.push_back(path == kStdinPath ? "<stdin>" : path);
    }

    // The first input decides chat vs plain (auto), so it is opened here and handed to the reader.
    LATHE_ASSIGN_OR_RETURN(
        std::unique_ptr<Source> first,
        Source::open(options.inputs[0], options.cancel, options.max_record_bytes));
    bool chat = prepare_format_is_conversation(options.format);
    report.format = options.format;
    if (options.format == PrepareFormat::kAuto) {
        LATHE_ASSIGN_OR_RETURN(const std::optional<std::string> line,
                               first->peek_first_content_line());
        const bool json = line.has_value() && starts_like_json_object(*line);
        if (json && !options.json_key.has_value()) {
            JsonlFieldReader probe("text");
            chat = !probe.has_field(*line, "text") && probe.has_field(*line, "messages");
        }
        report.format = json ? PrepareFormat::kJsonl : PrepareFormat::kText;
    }
    if (chat && !prepare_format_is_conversation(report.format))
        report.format = PrepareFormat::kChat;
    sh.run_is_chat = chat;
    if (options.format == PrepareFormat::kAlpaca && options.json_key.has_value()) {
        return invalid_argument_error(
            "--json-key does not apply to --format alpaca (its fields are instruction, input, "
            "output, system and history)");
    }
    sh.json_key =
        options.json_key.value_or(options.format == PrepareFormat::kSharegpt ? "conversations"
                                  : chat                                     ? "messages"
                                                                             : "text");
    if (options.max_tokens > 0 && !chat) {
        return invalid_argument_error(
            "--seq-length applies to conversation formats (chat, alpaca, sharegpt); this run is "
            "{}",
            prepare_format_name(report.format));
    }

    std::optional<ChatTemplate> chat_template;
    if (chat) {
        std::string config = options.chat_template_config;
        if (config.empty()) {
            const auto found = prepare_find_tokenizer_config(options.tokenizer_path);
            if (!found.has_value()) {
                return invalid_argument_error(
                    "chat data needs a chat template, and there is no tokenizer_config.json "
                    "beside {}; pass --chat-template-config FILE",
                    options.tokenizer_path);
            }
            config = *found;
        }
        LATHE_ASSIGN_OR_RETURN(ChatTemplate loaded, ChatTemplate::load(config));
        chat_template.emplace(std::move(loaded));
        sh.chat = &*chat_template;
        if (options.append_eod) {
            log_info(
                "chat: each conversation ends as its chat template ends it (eos_token follows "
                "only a final assistant turn that the template does not end itself); "
                "--append-eod adds nothing more");
        }
        if (const auto& eos = chat_template->eos_token(); eos.has_value()) {
            report.eod_token = *eos;
            report.eod_id = tokenizer.token_to_id(*eos);
            report.eod_source =
                "eos_token of " + config + ", appended where the template does not end the turn";
        }
        log_info("chat template: {}", chat_template->name());
    } else if (options.append_eod) {
        LATHE_ASSIGN_OR_RETURN(
            const EodChoice eod,
            prepare_resolve_eod(tokenizer, options.tokenizer_path, options.eod_token));
        sh.eod_id = eod.id;
        report.eod_id = eod.id;
        report.eod_token = eod.token;
        report.eod_source = eod.source;
        log_info("end of document: {} = id {} ({})", escape_for_message(eod.token), eod.id,
                 eod.source);
    }

    // Chat files are int32 with an int32 label file, as GPT-NeoX's chat script writes them.
    report.dtype = chat ? TokenDType::kInt32 : token_dtype_for_vocab(tokenizer.vocab_size());
    LATHE_ASSIGN_OR_RETURN(IndexedDatasetWriter tokens_out,
                           IndexedDatasetWriter::create(options.output_prefix, report.dtype));
    std::optional<IndexedDatasetWriter> labels_out;
    if (chat) {
        LATHE_ASSIGN_OR_RETURN(
            IndexedDatasetWriter w,
            IndexedDatasetWriter::create(options.output_prefix + "_label", TokenDType::kInt32));
        labels_out.emplace(std::move(w));
    }

    report.load_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto t_start = std::chrono::steady_clock::now();
    std::optional<Progress> progress;
    if (options.show_progress) progress.emplace("prepare", total_known ? total_raw : 0, "docs");

    // Read and write on this thread, tokenize on `threads` workers; batches are written strictly
    // in input order.
    BatchReader reader(sh, std::move(first), progress.has_value() ? &*progress : nullptr);
    const auto write = [&](Batch& batch) -> Status {
        if (options.cancel != nullptr && options.cancel->load()) {
            return cancelled_error("interrupted; nothing was written under {}",
                                   options.output_prefix);
        }
        if (!batch.errors.empty()) {
            if (options.on_error == OnError::kFail) {
                return invalid_argument_error(
                    "{} (fix the input, or pass --on-error skip to skip bad records)",
                    batch.errors.front());
            }
            for (size_t i = 0; i < batch.errors.size(); ++i) {
                std::string& e = batch.errors[i];
                ++report.skipped_by_problem[record_problem_name(batch.problems[i])];
                if (report.skipped < kMaxSkipExamples) {
                    log_warning("skipped {}", e);
                    report.skipped_examples.push_back(std::move(e));
                }
                ++report.skipped;
            }
        }
        size_t offset = 0;
        for (const uint64_t size : batch.doc_sizes) {
            const std::span<const int32_t> doc(batch.tokens.data() + offset, size);
            LATHE_RETURN_IF_ERROR(tokens_out.add_document(doc));
            if (labels_out.has_value()) {
                const std::span<const int32_t> labels(batch.labels.data() + offset, size);
                LATHE_RETURN_IF_ERROR(labels_out->add_document(labels));
                const auto trained = uint64_t(
                    std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l >= 0; }));
                report.trained_tokens += trained;
                if (trained == 0) ++report.untrained_documents;
            }
            offset += size;
        }
        if (progress.has_value()) progress->add(0, batch.doc_sizes.size());
        return batch.read_error;
    };
    Status run = ordered_parallel_map<Batch>(
        report.threads, [&sh] { return Worker(sh); },
        [&reader](Batch& b) { return reader.read(b); }, write);
    if (options.cancel != nullptr && options.cancel->load()) {
        // A read waiting on stdin ends with its own cancelled error; the run reports one message.
        return cancelled_error("interrupted; nothing was written under {}", options.output_prefix);
    }
    LATHE_RETURN_IF_ERROR(run);
    if (progress.has_value()) progress->finish();

    // SFT data that trains nothing (a --generation-role or --role-tags that names no turn of the
    // data, a template that puts no assistant turn where the labels look for it) is refused
    // before anything is written; documents without a trained token are counted.
    if (labels_out.has_value() && tokens_out.document_count() > 0) {
        if (report.trained_tokens == 0) {
            return invalid_argument_error(
                "no token of the {} documents is trained (every label is -100): no assistant turn "
                "was found; check --generation-role and --role-tags against the data, and the "
                "chat template; nothing was written under {}",
                tokens_out.document_count(), options.output_prefix);
        }
        if (report.untrained_documents > 0) {
            log_warning(
                "{} of {} documents have no trained token (every label is -100): conversations "
                "without an assistant turn the labels keep",
                report.untrained_documents, tokens_out.document_count());
        }
    }
    // Every record skipped: token files of no document would only fail later, at training.
    if (tokens_out.document_count() == 0 && report.skipped > 0) {
        return invalid_argument_error(
            "every record was skipped ({}; the first: {}): no document to write; nothing was "
            "written under {}",
            report.skipped, report.skipped_examples.empty() ? "" : report.skipped_examples[0],
            options.output_prefix);
    }
    LATHE_RETURN_IF_ERROR(tokens_out.finalize());
    std::vector<IndexedDatasetWriter*> writers = {&tokens_out};
    if (labels_out.has_value()) {
        LATHE_RETURN_IF_ERROR(labels_out->finalize());
        writers.push_back(&*labels_out);
    }
    if (options.cancel != nullptr && options.cancel->load()) {
        return cancelled_error("interrupted; nothing was written under {}", options.output_prefix);
    }
    LATHE_RETURN_IF_ERROR(indexed_commit_together(writers));
    for (IndexedDatasetWriter* w : writers) {
        report.outputs.push_back(indexed_bin_path(w->prefix()));
        report.outputs.push_back(indexed_idx_path(w->prefix()));
    }
    report.documents = tokens_out.document_count();
    report.tokens = tokens_out.token_count();
    report.input_bytes = reader.input_bytes();
    report.raw_bytes = reader.raw_bytes();
    report.blank_lines = reader.blank_lines();
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return report;
}

}  // namespace lathe
