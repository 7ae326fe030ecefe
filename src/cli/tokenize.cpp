// `lathe tokenize`: encode JSONL text with a Hugging Face tokenizer.json, or decode ids back.
//
//   lathe tokenize --tokenizer T.json [--special] [--decode] [--input F] [--output F]
//                  [--threads N] [--json-key K]
//
// Encode (default): each input line is a JSON object whose string field K (default "text") is
// encoded as HF's `Tokenizer.encode(text, add_special_tokens=S).ids`, with S true only under
// --special (the post-processor's special tokens, e.g. Llama-2's <s>; special tokens written in
// the text are always recognized, as in HF). One output line `{"ids":[...]}` per input line.
//
// Decode (--decode): each input line is a JSON object whose field K (default "ids") is an array
// of ids; the output line is `{"text":"..."}` with HF's `Tokenizer.decode(ids,
// skip_special_tokens=not S)`: without --special special tokens are dropped (HF's default
// skip_special_tokens=True), with --special they are kept.
//
// Input and output default to stdin/stdout ("-"); gzip/zstd input is read transparently; output
// to a file is atomic (nothing under the final name unless the whole run succeeded). Output lines
// are in input order whatever --threads (default: all cores). A malformed line stops the run
// with an error naming the file and line.

#include <simdjson.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "cli/command.h"
#include "core/log.h"
#include "core/ordered_pool.h"
#include "core/progress.h"
#include "core/strings.h"
#include "data/jsonl.h"
#include "io/file.h"
#include "io/input.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

struct TokenizeArgs {
    std::string tokenizer;
    bool special = false;
    bool decode = false;
    std::string input = "-";
    std::string output = "-";
    int threads = 0;
    std::string json_key;  // "" = "text" when encoding, "ids" when decoding
};

// Lines are handed to workers in batches of about this many bytes (or kBatchLines lines).
constexpr size_t kBatchBytes = 1 << 20;
constexpr size_t kBatchLines = 4096;

// A batch of input lines and, once processed, its output text (or the first error).
struct Batch {
    std::string text;            // the lines, each followed by '\n'
    std::vector<uint32_t> ends;  // end offset of each line in `text` (without the '\n')
    uint64_t first_line = 0;     // 1-based number of the first line
    std::string output;
    Status status;
};

void append_int(std::string& out, int32_t v) {
    char buf[16];
    char* e = buf + sizeof(buf);
    char* p = e;
    uint32_t u = v < 0 ? uint32_t(-(int64_t)v) : uint32_t(v);
    do {
        *--p = char('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0) *--p = '-';
    out.append(p, static_cast<size_t>(e - p));
}

// Per-thread state for processing batches.
class BatchWorker {
public:
    BatchWorker(const Tokenizer& tok, const TokenizeArgs& args, const std::string& input_name)
        : tok_(tok),
          args_(args),
          input_name_(input_name),
          field_reader_(args.json_key.empty() ? (args.decode ? "ids" : "text") : args.json_key) {}

    void process(Batch& b) {
        b.output.clear();
        size_t begin = 0;
        for (size_t i = 0; i < b.ends.size(); ++i) {
            std::string_view line(b.text.data() + begin, b.ends[i] - begin);
            begin = b.ends[i] + 1;
            const Status s = args_.decode ? decode_line(strip_cr(line), b.output)
                                          : encode_line(strip_cr(line), b.output);
            if (!s.ok()) {
                b.status = Status(
                    s.code(), fmt::format("{}:{}: {}", input_name_, b.first_line + i, s.message()));
                return;
            }
        }
    }

private:
    Status encode_line(std::string_view line, std::string& out) {
        LATHE_ASSIGN_OR_RETURN(std::string_view text, field_reader_.extract(line));
        LATHE_RETURN_IF_ERROR(tok_.encode(text, args_.special, ids_));
        out += "{\"ids\":[";
        for (size_t i = 0; i < ids_.size(); ++i) {
            if (i > 0) out.push_back(',');
            append_int(out, ids_[i]);
        }
        out += "]}\n";
        return ok_status();
    }

    Status decode_line(std::string_view line, std::string& out) {
        const std::string& key = field_reader_.key();
        if (line.empty()) return invalid_argument_error("empty line (expected a JSON object)");
        simdjson::dom::element root;
        if (auto err = parser_.parse(line.data(), line.size(), true).get(root); err) {
            return invalid_argument_error("not valid JSON: {}", simdjson::error_message(err));
        }
        simdjson::dom::object obj;
        if (root.get_object().get(obj) != simdjson::SUCCESS) {
            return invalid_argument_error("expected a JSON object with an array field '{}'", key);
        }
        simdjson::dom::array arr;
        simdjson::dom::element field;
        if (obj.at_key(key).get(field) != simdjson::SUCCESS) {
            return invalid_argument_error("no field '{}' (use --json-key to name the ids field)",
                                          key);
        }
        if (field.get_array().get(arr) != simdjson::SUCCESS) {
            return invalid_argument_error("field '{}' is not an array of ids", key);
        }
        ids_.clear();
        size_t i = 0;
        for (simdjson::dom::element e : arr) {
            int64_t v = 0;
            if (e.get_int64().get(v) != simdjson::SUCCESS || v < 0 || v > INT32_MAX) {
                return invalid_argument_error(
                    "field '{}' element {} is not an id (an integer in "
                    "[0, 2^31))",
                    key, i);
            }
            ids_.push_back(static_cast<int32_t>(v));
            ++i;
        }
        LATHE_ASSIGN_OR_RETURN(std::string text,
                               tok_.decode(ids_, /*skip_special=*/!args_.special));
        out += "{\"text\":";
        append_json_string(out, text);
        out += "}\n";
        return ok_status();
    }

    const Tokenizer& tok_;
    const TokenizeArgs& args_;
    const std::string& input_name_;
    JsonlFieldReader field_reader_;
    simdjson::dom::parser parser_;
    std::vector<int32_t> ids_;
};

// Where output goes: an atomic file, or stdout.
class Output {
public:
    static Result<Output> open(const std::string& path) {
        Output o;
        if (path != "-") {
            LATHE_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
            o.file_.emplace(std::move(f));
        }
        return o;
    }
    Status write(std::string_view data) {
        if (file_) return file_->write(data);
        if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size()) {
            return io_error("writing to standard output failed");
        }
        return ok_status();
    }
    Status commit() {
        if (file_) return file_->commit();
        if (std::fflush(stdout) != 0) return io_error("writing to standard output failed");
        return ok_status();
    }

private:
    std::optional<AtomicFile> file_;
};

Status run_tokenize(const TokenizeArgs& args) {
    Result<Tokenizer> loaded = Tokenizer::load(args.tokenizer);
    if (!loaded.ok()) return loaded.status().with_context("--tokenizer");
    Tokenizer tok = std::move(loaded).value();
    LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(args.input));
    LineReader lines(in);
    LATHE_ASSIGN_OR_RETURN(Output out, Output::open(args.output));
    const std::string input_name = in.name();
    const int threads =
        args.threads > 0 ? args.threads : std::max(1, int(std::thread::hardware_concurrency()));
    Progress progress(args.decode ? "decode" : "tokenize", in.raw_size(), "docs");

    // Reads the next batch of lines; false at the end of the input.
    auto fill = [&](Batch& b) -> Result<bool> {
        b.text.clear();
        b.ends.clear();
        b.output.clear();
        b.status = ok_status();
        std::string_view line;
        while (b.text.size() < kBatchBytes && b.ends.size() < kBatchLines) {
            LATHE_ASSIGN_OR_RETURN(bool more, lines.next(line));
            if (!more) break;
            if (b.ends.empty()) b.first_line = lines.line_number();
            b.text.append(line);
            b.ends.push_back(static_cast<uint32_t>(b.text.size()));
            b.text.push_back('\n');
        }
        return !b.ends.empty();
    };
    auto finish_batch = [&](Batch& b) -> Status {
        LATHE_RETURN_IF_ERROR(b.status);
        LATHE_RETURN_IF_ERROR(out.write(b.output));
        progress.add(b.text.size(), b.ends.size());
        return ok_status();
    };

    // With threads > 1 the calling thread reads and writes and `threads` workers, each with its own
    // BatchWorker, encode or decode; threads == 1 is everything on the calling thread (what "one
    // thread" means in benchmarks).
    auto make_worker = [&] {
        return [w = std::make_unique<BatchWorker>(tok, args, input_name)](Batch& b) {
            w->process(b);
            return b.status;
        };
    };
    LATHE_RETURN_IF_ERROR(ordered_parallel_map<Batch>(threads, make_worker, fill, finish_batch));
    LATHE_RETURN_IF_ERROR(out.commit());
    // The summary line goes to stderr, except under --quiet.
    if (log_level() <= LogLevel::kInfo) progress.finish();
    return ok_status();
}

}  // namespace

void cli_add_tokenize(CLI::App& parent, CommandAction& action) {
    auto args = std::make_shared<TokenizeArgs>();
    CLI::App* cmd = parent.add_subcommand(
        "tokenize",
        "Encode JSONL {\"text\": ...} lines to {\"ids\": [...]} with a Hugging Face tokenizer.json "
        "(byte-exact with HF tokenizers), or decode ids back with --decode");
    cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json (model type BPE)")->required();
    cmd->add_flag("--special", args->special,
                  "Encode: add the post-processor's special tokens (HF add_special_tokens=True). "
                  "Decode: keep special tokens (default skips them, as HF's "
                  "skip_special_tokens=True)");
    cmd->add_flag("--decode", args->decode,
                  "Decode {\"ids\": [...]} lines to {\"text\": ...} instead of encoding");
    cmd->add_option("--input", args->input, "Input JSONL file, gzip/zstd allowed ('-' = stdin)")
        ->capture_default_str();
    cmd->add_option("--output", args->output,
                    "Output JSONL file, written atomically ('-' = stdout)")
        ->capture_default_str();
    cmd->add_option("--threads", args->threads, "Worker threads (0 = all cores)")
        ->capture_default_str();
    cmd->add_option("--json-key", args->json_key,
                    "Input field to read (default: text; ids with --decode)");
    cmd->callback([args, &action] { action = [args] { return run_tokenize(*args); }; });
}

}  // namespace lathe
