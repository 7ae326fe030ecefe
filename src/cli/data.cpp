// `lathe data`: inspect and validate token files.
//
//   lathe data info PREFIX [--json]
//   lathe data dump PREFIX --doc N [--tokenizer T.json] [--json]

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "data/indexed_dataset.h"
#include "io/file.h"
#include "tokenizer/tokenizer.h"

namespace lathe {

namespace {

// A label file (GPT-NeoX train_label_data_paths) must have the token file's exact structure.
Status check_labels_match(const IndexedDataset& tokens, const IndexedDataset& labels) {
    if (labels.sequence_count() != tokens.sequence_count() ||
        labels.document_count() != tokens.document_count()) {
        return data_loss_error(
            "{}: {} sequences / {} documents, but {} has {} / {}: the label file does not belong "
            "to these tokens",
            labels.prefix(), labels.sequence_count(), labels.document_count(), tokens.prefix(),
            tokens.sequence_count(), tokens.document_count());
    }
    for (uint64_t i = 0; i < tokens.sequence_count(); ++i) {
        if (labels.sequence_length(i) != tokens.sequence_length(i)) {
            return data_loss_error("{}: sequence {} has {} labels for {} tokens", labels.prefix(),
                                   i, labels.sequence_length(i), tokens.sequence_length(i));
        }
    }
    for (uint64_t k = 0; k <= tokens.document_count(); ++k) {
        if (labels.doc_idx(k) != tokens.doc_idx(k)) {
            return data_loss_error("{}: doc_idx[{}] = {}, but the tokens have {}", labels.prefix(),
                                   k, labels.doc_idx(k), tokens.doc_idx(k));
        }
    }
    return ok_status();
}

std::string label_prefix(const std::string& prefix) {
    return prefix + "_label";
}

Status run_info(const std::string& prefix, bool json) {
    nlohmann::ordered_json j;
    j["prefix"] = prefix;
    auto ds = IndexedDataset::open(prefix);
    if (!ds.ok()) {
        // Say what can still be read, then the verdict.
        auto header = indexed_read_header(indexed_idx_path(prefix));
        if (json) {
            j["valid"] = false;
            j["error"] = ds.status().message();
            if (header.ok()) {
                j["dtype_code"] = header->dtype_code;
                j["sequences"] = header->sequence_count;
                j["doc_idx_entries"] = header->doc_idx_count;
            }
            std::printf("%s\n", j.dump(2).c_str());
        } else {
            std::printf("prefix: %s\n", prefix.c_str());
            if (header.ok()) {
                std::printf(
                    "dtype code: %u\nsequences (header): %llu\ndoc_idx entries (header): %llu\n",
                    header->dtype_code, static_cast<unsigned long long>(header->sequence_count),
                    static_cast<unsigned long long>(header->doc_idx_count));
            }
            std::printf("valid: no\nerror: %s\n", ds.status().message().c_str());
        }
        std::fflush(stdout);
        return ds.status();
    }
    uint64_t min_len = std::numeric_limits<uint64_t>::max();
    uint64_t max_len = 0;
    uint64_t empty_docs = 0;
    for (uint64_t k = 0; k < ds->document_count(); ++k) {
        const uint64_t n = ds->document_length(k);
        min_len = std::min(min_len, n);
        max_len = std::max(max_len, n);
        if (n == 0) ++empty_docs;
    }
    if (ds->document_count() == 0) min_len = 0;
    const double mean = ds->document_count() == 0 ? 0.0
                                                  : static_cast<double>(ds->token_count()) /
                                                        static_cast<double>(ds->document_count());
    // A label file beside the tokens (lathe prepare on chat data) is checked too.
    std::optional<Status> labels_status;
    if (file_exists(indexed_idx_path(label_prefix(prefix)))) {
        auto labels = IndexedDataset::open(label_prefix(prefix));
        labels_status = labels.ok() ? check_labels_match(*ds, *labels) : labels.status();
    }
    const bool valid = !labels_status.has_value() || labels_status->ok();

    if (json) {
        j["valid"] = valid;
        j["dtype"] = token_dtype_name(ds->dtype());
        j["dtype_code"] = static_cast<int>(ds->dtype());
        j["documents"] = ds->document_count();
        j["sequences"] = ds->sequence_count();
        j["tokens"] = ds->token_count();
        j["document_length"] = {{"min", min_len}, {"mean", mean}, {"max", max_len}};
        j["empty_documents"] = empty_docs;
        j["bin_bytes"] = ds->bin_bytes();
        j["idx_bytes"] = ds->idx_bytes();
        j["sequence_modes"] = ds->has_sequence_modes();
        j["warnings"] = ds->warnings();
        if (labels_status.has_value()) {
            j["labels"] = {{"prefix", label_prefix(prefix)},
                           {"valid", labels_status->ok()},
                           {"error", labels_status->ok() ? "" : labels_status->message()}};
        }
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("prefix: %s\n", prefix.c_str());
        std::printf("dtype: %s (code %d)\n", token_dtype_name(ds->dtype()),
                    static_cast<int>(ds->dtype()));
        std::printf("documents: %llu\n", static_cast<unsigned long long>(ds->document_count()));
        std::printf("sequences: %llu\n", static_cast<unsigned long long>(ds->sequence_count()));
        std::printf("tokens: %llu\n", static_cast<unsigned long long>(ds->token_count()));
        std::printf("document length: min %llu, mean %.1f, max %llu tokens\n",
                    static_cast<unsigned long long>(min_len), mean,
                    static_cast<unsigned long long>(max_len));
        if (empty_docs > 0) {
            std::printf("empty documents: %llu\n", static_cast<unsigned long long>(empty_docs));
        }
        std::printf("files: %s (%llu bytes), %s (%llu bytes)\n", indexed_bin_path(prefix).c_str(),
                    static_cast<unsigned long long>(ds->bin_bytes()),
                    indexed_idx_path(prefix).c_str(),
                    static_cast<unsigned long long>(ds->idx_bytes()));
        if (ds->has_sequence_modes()) std::printf("sequence modes: yes (Megatron-LM multimodal)\n");
        if (labels_status.has_value()) {
            std::printf("labels: %s (%s)\n", label_prefix(prefix).c_str(),
                        labels_status->ok() ? "valid, matches the tokens"
                                            : labels_status->message().c_str());
        }
        for (const std::string& w : ds->warnings()) std::printf("warning: %s\n", w.c_str());
        std::printf("valid: %s\n", valid ? "yes" : "no");
    }
    std::fflush(stdout);
    return valid ? ok_status() : *labels_status;
}

Status run_dump(const std::string& prefix, int64_t doc, const std::string& tokenizer_path,
                bool json) {
    LATHE_ASSIGN_OR_RETURN(const IndexedDataset ds, IndexedDataset::open(prefix));
    if (doc < 0 || static_cast<uint64_t>(doc) >= ds.document_count()) {
        return invalid_argument_error("--doc {}: {} has documents 0 to {}", doc, prefix,
                                      static_cast<int64_t>(ds.document_count()) - 1);
    }
    const uint64_t k = static_cast<uint64_t>(doc);
    std::vector<int64_t> ids;
    ds.read_document(k, ids);
    std::optional<std::vector<int64_t>> labels;
    if (file_exists(indexed_idx_path(label_prefix(prefix)))) {
        LATHE_ASSIGN_OR_RETURN(const IndexedDataset lds,
                               IndexedDataset::open(label_prefix(prefix)));
        LATHE_RETURN_IF_ERROR(check_labels_match(ds, lds));
        labels.emplace();
        lds.read_document(k, *labels);
    }
    std::optional<std::string> text;
    if (!tokenizer_path.empty()) {
        LATHE_ASSIGN_OR_RETURN(const Tokenizer tok, Tokenizer::load(tokenizer_path));
        std::vector<int32_t> ids32;
        ids32.reserve(ids.size());
        for (const int64_t id : ids) {
            if (id < 0 || id >= tok.vocab_size()) {
                return invalid_argument_error(
                    "document {} holds id {}, outside the {} vocabulary of {} (the wrong "
                    "tokenizer?)",
                    doc, id, tok.vocab_size(), tokenizer_path);
            }
            ids32.push_back(static_cast<int32_t>(id));
        }
        Result<std::string> decoded = tok.decode(ids32, /*skip_special=*/false);
        if (!decoded.ok())
            return decoded.status().with_context(fmt::format("{} document {}", prefix, doc));
        text = std::move(decoded).value();
    }
    const int64_t first_seq = ds.doc_idx(k);
    const int64_t seqs = ds.doc_idx(k + 1) - first_seq;
    if (json) {
        nlohmann::ordered_json j;
        j["prefix"] = prefix;
        j["doc"] = doc;
        j["sequences"] = seqs;
        j["ids"] = ids;
        if (labels.has_value()) j["labels"] = *labels;
        if (text.has_value()) j["text"] = *text;
        // Decoded text may hold bytes that are not UTF-8 (a token cut inside a character).
        std::printf("%s\n",
                    j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
        std::printf("document %lld of %llu in %s: %lld sequence%s, %zu tokens\n",
                    static_cast<long long>(doc),
                    static_cast<unsigned long long>(ds.document_count()), prefix.c_str(),
                    static_cast<long long>(seqs), seqs == 1 ? "" : "s", ids.size());
        std::string line = "ids:";
        for (const int64_t id : ids) line += " " + std::to_string(id);
        std::printf("%s\n", line.c_str());
        if (labels.has_value()) {
            std::string l = "labels:";
            for (const int64_t v : *labels) l += " " + std::to_string(v);
            std::printf("%s\n", l.c_str());
        }
        if (text.has_value()) {
            std::printf("text:\n");
            std::fwrite(text->data(), 1, text->size(), stdout);
            std::printf("\n");
        }
    }
    std::fflush(stdout);
    return ok_status();
}

}  // namespace

void cli_add_data(CLI::App& parent, CommandAction& action) {
    CLI::App* cmd = parent.add_subcommand("data", "Inspect and validate token files (.bin/.idx)");
    cmd->require_subcommand(1);

    CLI::App* info = cmd->add_subcommand(
        "info", "Validate a token file pair and show its dtype, counts and document lengths");
    auto info_prefix = std::make_shared<std::string>();
    auto info_json = std::make_shared<bool>(false);
    info->add_option("prefix", *info_prefix, "Token files without .bin/.idx")->required();
    info->add_flag("--json", *info_json, "Print JSON");
    info->callback([=, &action] { action = [=] { return run_info(*info_prefix, *info_json); }; });

    CLI::App* dump = cmd->add_subcommand(
        "dump", "Print one document's token ids (and labels), decoded with --tokenizer");
    auto dump_prefix = std::make_shared<std::string>();
    auto dump_doc = std::make_shared<int64_t>(0);
    auto dump_tokenizer = std::make_shared<std::string>();
    auto dump_json = std::make_shared<bool>(false);
    dump->add_option("prefix", *dump_prefix, "Token files without .bin/.idx")->required();
    dump->add_option("--doc", *dump_doc, "Document number, from 0")->required();
    dump->add_option("--tokenizer", *dump_tokenizer, "tokenizer.json to decode the ids with");
    dump->add_flag("--json", *dump_json, "Print JSON");
    dump->callback([=, &action] {
        action = [=] { return run_dump(*dump_prefix, *dump_doc, *dump_tokenizer, *dump_json); };
    });
}

}  // namespace lathe
