#include "tokenizer/tokenizer.h"

#include <simdjson.h>

#include <atomic>

#include "core/log.h"
#include "core/strings.h"
#include "io/file.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/components.h"
#include "tokenizer/decoder.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/utf8.h"

namespace lathe {

namespace {

// Work buffers of one thread for one tokenizer: the BPE memo and every buffer the encode path
// needs, so that a warm encode allocates nothing but the growth of the output vector.
struct EncodeContext {
    BpeCache cache;
    BpeWork work;
    PieceList pieces;
    PieceList scratch;
    std::string normalized;
    std::vector<AddedSplit> raw_splits;
    std::vector<AddedSplit> normalized_splits;
    std::vector<int32_t> post_scratch;
};

// Each Tokenizer gets a process-unique serial; threads keep the contexts of the few tokenizers
// they used last (a thread normally serves one tokenizer).
std::atomic<uint64_t> g_next_serial{1};
constexpr size_t kContextsPerThread = 4;

EncodeContext& thread_context(uint64_t serial) {
    thread_local std::vector<std::pair<uint64_t, std::unique_ptr<EncodeContext>>> contexts;
    for (auto& [s, c] : contexts) {
        if (s == serial) return *c;
    }
    if (contexts.size() >= kContextsPerThread) contexts.erase(contexts.begin());
    contexts.emplace_back(serial, std::make_unique<EncodeContext>());
    return *contexts.back().second;
}

Result<std::vector<AddedToken>> parse_added_tokens(const JsonNode& root) {
    std::vector<AddedToken> tokens;
    std::optional<JsonNode> list = root.field("added_tokens");
    if (!list || list->is_null()) return tokens;
    LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, list->as_array());
    for (const JsonNode& item : items) {
        AddedToken t;
        LATHE_ASSIGN_OR_RETURN(JsonNode content, item.required("content"));
        LATHE_ASSIGN_OR_RETURN(std::string_view c, content.as_string());
        t.content = std::string(c);
        LATHE_ASSIGN_OR_RETURN(t.special, item.get_bool("special", false));
        LATHE_ASSIGN_OR_RETURN(t.single_word, item.get_bool("single_word", false));
        LATHE_ASSIGN_OR_RETURN(t.lstrip, item.get_bool("lstrip", false));
        LATHE_ASSIGN_OR_RETURN(t.rstrip, item.get_bool("rstrip", false));
        LATHE_ASSIGN_OR_RETURN(t.normalized, item.get_bool("normalized", !t.special));
        tokens.push_back(std::move(t));
    }
    return tokens;
}

}  // namespace

struct Tokenizer::Impl {
    std::string source;
    std::unique_ptr<Normalizer> normalizer;
    std::unique_ptr<PreTokenizer> pre_tokenizer;
    std::unique_ptr<BpeModel> model;
    std::optional<PostProcessor> post_processor;
    std::unique_ptr<Decoder> decoder;
    AddedVocabulary added;
    uint64_t serial = 0;
    int32_t vocab_size = 0;

    Status encode_segment(std::string_view segment, bool at_origin, EncodeContext& ctx,
                          std::vector<int32_t>& ids) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
    return from_json(text, path);
}

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& source_name) {
    auto impl = std::make_unique<Impl>();
    impl->source = source_name;
    impl->serial = g_next_serial.fetch_add(1);
    simdjson::dom::parser parser;
    LATHE_ASSIGN_OR_RETURN(JsonNode root, json_parse_root(parser, json_text, &impl->source, ""));
    LATHE_RETURN_IF_ERROR(root.expect_object());

    LATHE_ASSIGN_OR_RETURN(JsonNode model, root.required("model"));
    LATHE_RETURN_IF_ERROR(model.expect_object());
    LATHE_ASSIGN_OR_RETURN(std::string_view model_type, model.get_string("type", "BPE"));
    if (model_type != "BPE") {
        return Status(StatusCode::kUnimplemented,
                      fmt::format("{}: model.type: lathe reads BPE models only, this file has '{}'",
                                  source_name, model_type));
    }
    LATHE_ASSIGN_OR_RETURN(impl->model, BpeModel::from_node(model));

    if (std::optional<JsonNode> n = root.field("normalizer"); n && !n->is_null()) {
        LATHE_ASSIGN_OR_RETURN(impl->normalizer, normalizer_from_node(*n));
    }
    if (std::optional<JsonNode> p = root.field("pre_tokenizer"); p && !p->is_null()) {
        LATHE_ASSIGN_OR_RETURN(impl->pre_tokenizer, pre_tokenizer_from_node(*p));
    }
    if (std::optional<JsonNode> p = root.field("post_processor"); p && !p->is_null()) {
        LATHE_ASSIGN_OR_RETURN(PostProcessor pp, PostProcessor::from_node(*p));
        impl->post_processor.emplace(std::move(pp));
    }
    if (std::optional<JsonNode> d = root.field("decoder"); d && !d->is_null()) {
        LATHE_ASSIGN_OR_RETURN(impl->decoder, decoder_from_node(*d));
    }
    for (const char* key : {"truncation", "padding"}) {
        if (std::optional<JsonNode> n = root.field(key); n && !n->is_null()) {
            log_warning("{}: '{}' is set; lathe ignores it (ids are never truncated or padded)",
                        source_name, key);
        }
    }

    LATHE_ASSIGN_OR_RETURN(std::vector<AddedToken> added, parse_added_tokens(root));
    const BpeModel* bpe = impl->model.get();
    const Normalizer* normalizer = impl->normalizer.get();
    impl->added.add_tokens(
        added, [bpe](std::string_view s) { return bpe->token_to_id(s); }, bpe->vocab_entries(),
        [normalizer](const std::string& s) {
            return normalizer ? normalizer->normalize_to_string(s) : s;
        });
    impl->vocab_size = std::max(bpe->max_id(), impl->added.max_id()) + 1;
    return Tokenizer(std::move(impl));
}

Status Tokenizer::Impl::encode_segment(std::string_view segment, bool at_origin,
                                       EncodeContext& ctx, std::vector<int32_t>& ids) const {
    if (pre_tokenizer == nullptr) return model->tokenize(segment, ctx.cache, ctx.work, ids);
    ctx.pieces.clear();
    ctx.pieces.add(segment, at_origin);
    pre_tokenizer->pre_tokenize(ctx.pieces, ctx.scratch);
    return model->tokenize_pieces(ctx.pieces, ctx.cache, ctx.work, ids);
}

Status Tokenizer::encode(std::string_view text, bool add_special, std::vector<int32_t>& ids) const {
    ids.clear();
    if (!simdjson::validate_utf8(text.data(), text.size())) {
        const size_t at = utf8::first_invalid(text);
        return invalid_argument_error("text is not valid UTF-8 (invalid byte 0x{:02X} at offset {})",
                                      static_cast<uint8_t>(text[at]), at);
    }
    const Impl& im = *impl_;
    EncodeContext& ctx = thread_context(im.serial);
    ctx.raw_splits.clear();
    im.added.split(text, /*normalized=*/false, ctx.raw_splits);
    for (const AddedSplit& rs : ctx.raw_splits) {
        if (rs.id >= 0) {
            ids.push_back(rs.id);
            continue;
        }
        if (rs.begin == rs.end) continue;
        std::string_view segment = text.substr(rs.begin, rs.end - rs.begin);
        bool at_origin = rs.begin == 0;
        if (im.normalizer) {
            ctx.normalized.clear();
            at_origin = im.normalizer->normalize(segment, ctx.normalized) && at_origin;
            segment = ctx.normalized;
        }
        if (!im.added.has_normalized_tokens()) {
            if (!segment.empty()) LATHE_RETURN_IF_ERROR(im.encode_segment(segment, at_origin, ctx, ids));
            continue;
        }
        ctx.normalized_splits.clear();
        im.added.split(segment, /*normalized=*/true, ctx.normalized_splits);
        for (const AddedSplit& ns : ctx.normalized_splits) {
            if (ns.id >= 0) {
                ids.push_back(ns.id);
            } else if (ns.begin != ns.end) {
                LATHE_RETURN_IF_ERROR(im.encode_segment(segment.substr(ns.begin, ns.end - ns.begin),
                                                        at_origin && ns.begin == 0, ctx, ids));
            }
        }
    }
    if (add_special && im.post_processor) im.post_processor->apply(ids, ctx.post_scratch);
    return ok_status();
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_special) const {
    std::vector<int32_t> ids;
    LATHE_RETURN_IF_ERROR(encode(text, add_special, ids));
    return ids;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    const Impl& im = *impl_;
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t id = ids[i];
        std::optional<std::string_view> t;
        if (const std::string* added = im.added.decode_form(id)) {
            t = *added;
        } else {
            t = im.model->id_to_token(id);
        }
        if (!t) {
            return invalid_argument_error("id {} (position {}) is not in the vocabulary of {} "
                                          "(ids run from 0 to {})",
                                          id, i, im.source, im.vocab_size - 1);
        }
        if (skip_special && im.added.is_special_string(*t)) continue;
        tokens.emplace_back(*t);
    }
    if (im.decoder) return im.decoder->decode(std::move(tokens));
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (i > 0) out += ' ';
        out += tokens[i];
    }
    return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    if (std::optional<int32_t> id = impl_->added.token_to_id(token)) return id;
    return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
    if (const std::string* t = impl_->added.decode_form(id)) return *t;
    if (std::optional<std::string_view> t = impl_->model->id_to_token(id)) return std::string(*t);
    return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
    const AddedToken* t = impl_->added.token(id);
    return t != nullptr && impl_->added.is_special_string(t->content);
}

}  // namespace lathe
