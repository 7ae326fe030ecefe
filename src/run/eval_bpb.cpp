#include "run/eval_bpb.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "io/json.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/checkpoint_dir.h"
#include "run/compute_device.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace lathe {

namespace {

namespace fs = std::filesystem;

// config.json's bos_token_id, else its eos_token_id (the first of a list).
Result<int32_t> prefix_token(const fs::path& dir) {
    const fs::path path = dir / "config.json";
    std::ifstream in(path);
    const nlohmann::json j = json_parse<nlohmann::json>(in);
    if (j.is_discarded()) return invalid_argument_error("{}: not valid JSON", path.string());
    for (const char* key : {"bos_token_id", "eos_token_id"}) {
        if (!j.contains(key)) continue;
        const nlohmann::json& v = j[key];
        if (v.is_number_integer()) return v.get<int32_t>();
        if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int32_t>();
    }
    return invalid_argument_error(
        "{}: neither bos_token_id nor eos_token_id is set (bpb predicts a document's first token "
        "from one of them)",
        path.string());
}

// The documents of --data and where each starts: its line in a .jsonl file, 0 for a whole file.
struct Documents {
    std::vector<std::string> texts;
    std::vector<int64_t> lines;
};

// An error for `text` (line `line` of `data`, or the whole file when line is 0) when it is not
// UTF-8, naming the line, the byte column and the byte.
Status check_utf8(std::string_view text, const std::string& data, int64_t line) {
    const std::optional<utf8::InvalidAt> bad = utf8::find_invalid(text);
    if (!bad) return ok_status();
    if (line > 0) {
        return invalid_argument_error(
            "--data {}:{}: invalid UTF-8 at byte column {} (byte 0x{:02x}); the input must be "
            "UTF-8",
            data, line, bad->column, bad->byte);
    }
    return invalid_argument_error(
        "--data {}:{}: invalid UTF-8 at byte column {} (byte 0x{:02x}, byte offset {} of the "
        "file); the input must be UTF-8",
        data, bad->line, bad->column, bad->byte, bad->offset);
}

Result<Documents> read_documents(const std::string& data) {
    std::ifstream in(data, std::ios::binary);
    if (!in) return not_found_error("--data {}: cannot open", data);
    Documents docs;
    if (fs::path(data).extension() != ".jsonl") {
        std::ostringstream all;
        all << in.rdbuf();
        std::string text = all.str();
        LATHE_RETURN_IF_ERROR(check_utf8(text, data, 0));
        docs.texts.push_back(std::move(text));
        docs.lines.push_back(0);
        return docs;
    }
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        // Before the JSON parser, which refuses invalid UTF-8 without saying where.
        LATHE_RETURN_IF_ERROR(check_utf8(line, data, n));
        const nlohmann::json j = json_parse<nlohmann::json>(line);
        if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string())
            return invalid_argument_error("{}:{}: expected {{\"text\": \"...\"}}", data, n);
        docs.texts.push_back(j["text"].get<std::string>());
        docs.lines.push_back(n);
    }
    return docs;
}

}  // namespace

Result<EvalBpbResult> eval_bpb_run(const EvalBpbRequest& r) {
    if (r.seq_len < 1) return invalid_argument_error("--seq-len must be >= 1, got {}", r.seq_len);
    const Result<fs::path> resolved = resolve_checkpoint(r.checkpoint);
    if (!resolved.ok()) return resolved.status().with_context("--checkpoint");
    const fs::path dir = *resolved;
    LATHE_ASSIGN_OR_RETURN(const Tokenizer tok, checkpoint_tokenizer(dir));
    LATHE_ASSIGN_OR_RETURN(const int32_t prefix, prefix_token(dir));
    auto config = model_config_from_hf_file(dir.string());
    if (!config.ok()) return config.status().with_context("--checkpoint");
    if (r.seq_len > config->max_position_embeddings) {
        return invalid_argument_error("--seq-len {} exceeds the model's max_position_embeddings {}",
                                      r.seq_len, config->max_position_embeddings);
    }
    LATHE_ASSIGN_OR_RETURN(const Documents read, read_documents(r.data));
    const std::vector<std::string>& docs = read.texts;
    EvalBpbResult out;
    out.checkpoint = dir.string();
    out.documents = int64_t(docs.size());
    for (const std::string& d : docs) out.bytes += int64_t(d.size());
    if (out.bytes == 0) return invalid_argument_error("--data {}: no text", r.data);

    const int64_t T = r.seq_len;
    ModelShape shape;
    shape.batch = 1;
    shape.seq_len = T;
    shape.training = false;
    LATHE_ASSIGN_OR_RETURN(ComputeDevice device, ComputeDevice::open(r.device, "--device"));
    LATHE_ASSIGN_OR_RETURN(Model model,
                           model_create_loaded(*config, shape, device.context(), dir.string()));
    std::vector<int32_t> tokens(static_cast<size_t>(T)), targets(static_cast<size_t>(T));
    for (size_t d = 0; d < docs.size(); ++d) {
        Result<std::vector<int32_t>> encoded = tok.encode(docs[d], false);
        if (!encoded.ok()) {
            return encoded.status().with_context(
                read.lines[d] > 0 ? fmt::format("--data {}:{}", r.data, read.lines[d])
                                  : fmt::format("--data {}", r.data));
        }
        const std::vector<int32_t>& ids = *encoded;
        if (ids.empty()) continue;
        std::vector<int32_t> s;
        s.reserve(ids.size() + 1);
        s.push_back(prefix);
        s.insert(s.end(), ids.begin(), ids.end());
        for (int32_t id : s) {
            if (id < 0 || id >= config->vocab_size) {
                return invalid_argument_error(
                    "--data {}: document {} encodes to id {}, outside the model's vocabulary ({})",
                    r.data, d + 1, id, config->vocab_size);
            }
        }
        for (int64_t w = 0; w * T + 1 < int64_t(s.size()); ++w) {
            const int64_t n = std::min<int64_t>(T, int64_t(s.size()) - 1 - w * T);
            std::fill(tokens.begin(), tokens.end(), 0);
            std::fill(targets.begin(), targets.end(), -100);
            std::copy_n(s.begin() + w * T, n, tokens.begin());
            std::copy_n(s.begin() + w * T + 1, n, targets.begin());
            ModelBatch batch;
            batch.tokens = ConstTensorView(tokens.data(), DType::kI32, Shape{1, T});
            batch.targets = ConstTensorView(targets.data(), DType::kI32, Shape{1, T});
            out.nats += double(model.forward(batch)) * double(n);
            out.tokens += n;
        }
    }
    out.bpb = out.nats / (std::log(2.0) * double(out.bytes));
    return out;
}

std::string eval_bpb_json(const EvalBpbRequest& request, const EvalBpbResult& result) {
    nlohmann::ordered_json j;
    j["bpb"] = result.bpb;
    j["nats"] = result.nats;
    j["bytes"] = result.bytes;
    j["tokens"] = result.tokens;
    j["documents"] = result.documents;
    j["seq_len"] = request.seq_len;
    j["device"] = request.device;
    j["checkpoint"] = result.checkpoint;
    j["data"] = request.data;
    return j.dump();
}

}  // namespace lathe
