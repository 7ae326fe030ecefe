#include "align/eval.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "align/map.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/model_io.h"
#include "model/registry.h"
#include "run/convert.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace fs = std::filesystem;

double align_bleu1(std::span<const int32_t> hyp, std::span<const int32_t> ref) {
    if (hyp.empty()) return 0.0;
    std::unordered_map<int32_t, int64_t> ref_counts, hyp_counts;
    for (int32_t r : ref) ++ref_counts[r];
    for (int32_t h : hyp) ++hyp_counts[h];
    int64_t clipped = 0;
    for (const auto& [tok, n] : hyp_counts) {
        auto it = ref_counts.find(tok);
        if (it != ref_counts.end()) clipped += std::min(n, it->second);
    }
    if (clipped == 0) return 0.0;  // nltk returns 0 when a precision is 0
    const double precision = double(clipped) / double(hyp.size());
    const double c = double(hyp.size()), r = double(ref.size());
    const double bp = c > r ? 1.0 : std::exp(1.0 - r / c);
    return bp * precision;
}

Result<std::vector<std::string>> align_read_documents(const std::string& path,
                                                      TextRecordFormat format,
                                                      int64_t max_documents) {
    LATHE_ASSIGN_OR_RETURN(InputStream in, InputStream::open(path));
    TextRecordReader reader(in, format);
    std::vector<std::string> docs;
    TextRecord rec;
    while (max_documents <= 0 || int64_t(docs.size()) < max_documents) {
        LATHE_ASSIGN_OR_RETURN(bool more, reader.next(rec));
        if (!more) break;
        if (is_blank_line(rec.text)) continue;
        docs.emplace_back(rec.text);
    }
    if (docs.empty()) return invalid_argument_error("{}: no non-empty document", path);
    return docs;
}

Result<AlignEvalModel> align_bits_per_byte(const Context& ctx, const std::string& checkpoint,
                                           std::span<const std::string> documents, int64_t seq_len,
                                           int64_t batch) {
    if (seq_len < 1) return invalid_argument_error("--seq-len must be >= 1, got {}", seq_len);
    if (batch < 1) return invalid_argument_error("--batch must be >= 1, got {}", batch);
    LATHE_ASSIGN_OR_RETURN(ConvertSource src, convert_find_source(checkpoint));
    const std::string config_path = (fs::path(src.dir) / "config.json").string();
    LATHE_ASSIGN_OR_RETURN(ModelConfig config, model_config_from_hf_file(config_path));
    if (seq_len > config.max_position_embeddings) {
        return invalid_argument_error(
            "--seq-len {} exceeds the model's max_position_embeddings {} ({})", seq_len,
            config.max_position_embeddings, config_path);
    }
    const std::string tok_path = (fs::path(src.dir) / "tokenizer.json").string();
    LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(tok_path));
    if (tok.vocab_size() > config.vocab_size) {
        return invalid_argument_error(
            "{} has {} ids but the model has {} embedding rows ({}): the model does not "
            "match its tokenizer",
            tok_path, tok.vocab_size(), config.vocab_size, config_path);
    }
    // The boundary token: none when the tokenizer adds one at the front.
    std::optional<int32_t> boundary;
    {
        LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> plain, tok.encode("a", false));
        LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> with, tok.encode("a", true));
        const bool adds_front =
            with.size() > plain.size() && !plain.empty() && with.front() != plain.front();
        if (!adds_front) {
            if (config.hf.bos_token_id) {
                boundary = int32_t(*config.hf.bos_token_id);
            } else if (!config.hf.eos_token_ids.empty()) {
                boundary = int32_t(config.hf.eos_token_ids.front());
            } else {
                return invalid_argument_error(
                    "{}: the tokenizer adds no BOS and config.json names neither "
                    "bos_token_id nor eos_token_id: nothing to predict a document's first "
                    "token from",
                    checkpoint);
            }
        }
    }

    // Windows of up to T + 1 tokens, overlapping by one (see eval.h).
    const int64_t T = seq_len;
    std::vector<std::vector<int32_t>> windows;
    int64_t bytes = 0;
    for (const std::string& doc : documents) {
        std::vector<int32_t> s;
        if (boundary) s.push_back(*boundary);
        LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(doc, true));
        s.insert(s.end(), ids.begin(), ids.end());
        bytes += int64_t(doc.size());
        const int64_t n = int64_t(s.size()) - 1;  // predictions
        for (int64_t begin = 0; begin < n; begin += T) {
            const int64_t end = std::min(n, begin + T) + 1;
            windows.emplace_back(s.begin() + begin, s.begin() + end);
        }
    }

    ModelShape shape;
    shape.batch = batch;
    shape.seq_len = T;
    shape.training = false;  // forward only: no gradients
    LATHE_ASSIGN_OR_RETURN(Model model, Model::create(config, shape, ctx));
    {
        LATHE_ASSIGN_OR_RETURN(SafetensorsCheckpoint ck, SafetensorsCheckpoint::open(src.dir));
        LATHE_RETURN_IF_ERROR(model_load_hf(model, ck));
    }
    AlignEvalModel out;
    out.checkpoint = checkpoint;
    out.windows = int64_t(windows.size());
    std::vector<int32_t> tokens, targets;
    for (size_t w0 = 0; w0 < windows.size(); w0 += size_t(batch)) {
        const int64_t nb = std::min<int64_t>(batch, int64_t(windows.size() - w0));
        // The batch's length: its longest window (shorter ones padded, their targets ignored).
        int64_t len = 0;
        for (int64_t b = 0; b < nb; ++b)
            len = std::max<int64_t>(len, int64_t(windows[w0 + size_t(b)].size()) - 1);
        tokens.assign(size_t(nb * len), 0);
        targets.assign(size_t(nb * len), -100);
        int64_t predicted = 0;
        for (int64_t b = 0; b < nb; ++b) {
            const std::vector<int32_t>& w = windows[w0 + size_t(b)];
            for (size_t i = 0; i + 1 < w.size(); ++i) {
                tokens[size_t(b * len) + i] = w[i];
                targets[size_t(b * len) + i] = w[i + 1];
                ++predicted;
            }
        }
        ModelBatch mb;
        mb.tokens = ConstTensorView(tokens.data(), DType::kI32, Shape{nb, len});
        mb.targets = ConstTensorView(targets.data(), DType::kI32, Shape{nb, len});
        out.nll_nats += double(model.forward(mb)) * double(predicted);
        out.predicted_tokens += predicted;
    }
    out.bits_per_byte = out.nll_nats / std::numbers::ln2 / double(std::max<int64_t>(bytes, 1));
    return out;
}

Result<AlignEvalResult> align_eval_run(const Context& ctx, const AlignEvalRequest& req) {
    const bool alignment =
        !req.map.empty() || !req.source_tokenizer.empty() || !req.target_tokenizer.empty();
    if (alignment &&
        (req.map.empty() || req.source_tokenizer.empty() || req.target_tokenizer.empty())) {
        return invalid_argument_error(
            "the alignment score needs --map, --source-tokenizer and --target-tokenizer "
            "together");
    }
    if (!alignment && req.tokenizers.empty() && req.checkpoints.empty()) {
        return invalid_argument_error(
            "nothing to evaluate: give --map with --source-tokenizer/--target-tokenizer, "
            "--tokenizer, or --checkpoint");
    }
    LATHE_ASSIGN_OR_RETURN(std::vector<std::string> docs,
                           align_read_documents(req.documents, req.format, req.max_documents));
    AlignEvalResult result;
    result.documents = int64_t(docs.size());
    for (const std::string& d : docs) result.bytes += int64_t(d.size());

    if (alignment) {
        LATHE_ASSIGN_OR_RETURN(Tokenizer src, Tokenizer::load(req.source_tokenizer));
        LATHE_ASSIGN_OR_RETURN(Tokenizer tgt, Tokenizer::load(req.target_tokenizer));
        LATHE_ASSIGN_OR_RETURN(std::vector<int32_t> map, align_read_map(req.map));
        if (int64_t(map.size()) != tgt.vocab_size()) {
            return invalid_argument_error("{} maps {} ids but {} has {}", req.map, map.size(),
                                          req.target_tokenizer, tgt.vocab_size());
        }
        double total = 0.0;
        std::vector<int32_t> s, t, pred;
        for (const std::string& d : docs) {
            LATHE_RETURN_IF_ERROR(src.encode(d, false, s));
            LATHE_RETURN_IF_ERROR(tgt.encode(d, false, t));
            pred.resize(t.size());
            for (size_t i = 0; i < t.size(); ++i) pred[i] = map[size_t(t[i])];
            total += align_bleu1(pred, s);
        }
        result.has_alignment = true;
        result.alignment_bleu1 = total / double(docs.size());
    }
    for (const std::string& path : req.tokenizers) {
        LATHE_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(path));
        AlignEvalTokenizer e;
        e.path = path;
        std::vector<int32_t> ids;
        for (const std::string& d : docs) {
            LATHE_RETURN_IF_ERROR(tok.encode(d, false, ids));
            e.tokens += int64_t(ids.size());
        }
        e.tokens_per_byte = double(e.tokens) / double(std::max<int64_t>(result.bytes, 1));
        result.tokenizers.push_back(e);
    }
    for (const std::string& ck : req.checkpoints) {
        auto m = align_bits_per_byte(ctx, ck, docs, req.seq_len, req.batch);
        if (!m.ok()) return m.status().with_context(fmt::format("--checkpoint {}", ck));
        result.models.push_back(std::move(m).value());
    }
    return result;
}

std::string align_eval_result_json(const AlignEvalResult& r) {
    nlohmann::ordered_json j;
    j["documents"] = r.documents;
    j["bytes"] = r.bytes;
    if (r.has_alignment) j["alignment_bleu1"] = r.alignment_bleu1;
    nlohmann::ordered_json toks = nlohmann::ordered_json::array();
    for (const AlignEvalTokenizer& t : r.tokenizers) {
        toks.push_back(
            {{"tokenizer", t.path}, {"tokens", t.tokens}, {"tokens_per_byte", t.tokens_per_byte}});
    }
    if (!r.tokenizers.empty()) j["tokenizers"] = toks;
    nlohmann::ordered_json models = nlohmann::ordered_json::array();
    for (const AlignEvalModel& m : r.models) {
        models.push_back({{"checkpoint", m.checkpoint},
                          {"bits_per_byte", m.bits_per_byte},
                          {"nll_nats", m.nll_nats},
                          {"predicted_tokens", m.predicted_tokens},
                          {"windows", m.windows}});
    }
    if (!r.models.empty()) j["models"] = models;
    return j.dump();
}

}  // namespace lathe
