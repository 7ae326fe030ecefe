#include "data/tokenize_jsonl.h"

#include <simdjson.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "core/ordered_pool.h"
#include "core/progress.h"
#include "core/strings.h"
#include "data/jsonl.h"
#include "data/line_output.h"
#include "io/input.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

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
    BatchWorker(const Tokenizer& tok, const TokenizeJsonlOptions& args,
                const std::string& input_name)
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
    const TokenizeJsonlOptions& args_;
    const std::string& input_name_;
    JsonlFieldReader field_reader_;
    simdjson::dom::parser parser_;
    std::vector<int32_t> ids_;
};

}  // namespace

Status tokenize_jsonl(const TokenizeJsonlOptions& args) {
    Result<Tokenizer> loaded = Tokenizer::load(args.tokenizer);
    if (!loaded.ok()) return loaded.status().with_context("--tokenizer");
    Tokenizer tok = std::move(loaded).value();
    LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(args.input));
    LineReader lines(in);
    LATHE_ASSIGN_OR_RETURN(LineOutput out, LineOutput::open(args.output));
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
    if (args.show_progress) progress.finish();
    return ok_status();
}

}  // namespace lathe
