#include "tokenizer/tokenizer.h"

#include <simdjson.h>

#include <atomic>
#include <filesystem>
#include <limits>

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
        // The file's id is not used (ids are assigned as HF assigns them), but HF refuses a file
        // whose added token has no id or one that is not a u32, and so does lathe.
        std::optional<JsonNode> id = item.field("id");
        if (!id) return item.error("missing \"id\" (Hugging Face tokenizers requires it)");
        uint64_t id_value = 0;
        if (id->element().get_uint64().get(id_value) != simdjson::SUCCESS ||
            id_value > std::numeric_limits<uint32_t>::max()) {
            return id->error(
                fmt::format("the id of added token '{}' is {}; Hugging Face "
                            "tokenizers takes an integer from 0 to 2^32 - 1",
                            escape_for_message(t.content), simdjson::minify(id->element())));
        }
        tokens.push_back(std::move(t));
    }
    return tokens;
}

constexpr std::string_view kExpected =
    "expected a Hugging Face tokenizer.json (a JSON object with a \"model\" object, as the "
    "`tokenizers` library saves it)";

Status not_a_tokenizer(const std::string& source, std::string_view what) {
    return invalid_argument_error("{}: {}; {}", source, what, kExpected);
}

// The first line of text (for messages), shortened.
std::string first_line(std::string_view text) {
    const size_t start = text.find_first_not_of(" \t\r\n");
    if (start == std::string_view::npos) return "";
    std::string_view line = text.substr(start);
    line = line.substr(0, std::min(line.find('\n'), size_t{60}));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return escape_for_message(line);
}

// The text around the first integer of more than 19 digits (one simdjson cannot read), for
// messages; nullopt when there is none.
std::optional<std::string> near_long_integer(std::string_view text) {
    size_t run = 0;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] >= '0' && text[i] <= '9') {
            if (++run < 20) continue;
            const size_t begin = i + 1 - run;
            size_t end = begin;
            while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
            // From the start of its member ("token": 123...), at most 60 bytes back.
            size_t from = begin > 60 ? begin - 60 : 0;
            const size_t sep = text.substr(0, begin).find_last_of(",{[\n");
            if (sep != std::string_view::npos && sep + 1 > from) from = sep + 1;
            while (from < begin && (text[from] == ' ' || text[from] == '\t')) ++from;
            while (from < begin && (static_cast<uint8_t>(text[from]) & 0xC0) == 0x80) ++from;
            return escape_for_message(text.substr(from, end - from));
        }
        run = 0;
    }
    return std::nullopt;
}

// What a text that is not a JSON document holds, for the error of a file of the wrong kind.
std::string describe_non_json(simdjson::dom::parser& parser, std::string_view text,
                              simdjson::error_code err) {
    const size_t start = text.find_first_not_of(" \t\r\n");
    const size_t eol = text.find('\n', start);
    if (eol != std::string_view::npos &&
        text.find_first_not_of(" \t\r\n", eol) != std::string_view::npos) {
        simdjson::dom::element line;
        const std::string_view first = text.substr(start, eol - start);
        if (parser.parse(first.data(), first.size(), true).get(line) == simdjson::SUCCESS) {
            return "it holds JSON Lines (one JSON document per line, such as a corpus), not one "
                   "JSON object";
        }
    }
    const char c = text[start];
    if (c != '{' && c != '[') {
        return fmt::format("it is not JSON (it begins '{}'; a YAML or text file?)",
                           first_line(text));
    }
    return fmt::format("it is not valid JSON ({})", simdjson::error_message(err));
}

// What a JSON object without a "model" object looks like, for the same error.
std::string describe_object_without_model(const simdjson::dom::object& object) {
    bool config = false;
    bool tokenizer_config = false;
    std::string keys;
    size_t n = 0;
    for (auto [key, value] : object) {
        if (key == "chat_template" || key == "tokenizer_class" || key == "added_tokens_decoder") {
            tokenizer_config = true;
        }
        if (key == "architectures" || key == "model_type" || key == "hidden_size") config = true;
        if (n < 5) keys += fmt::format("{}\"{}\"", n == 0 ? "" : ", ", escape_for_message(key));
        ++n;
    }
    if (n > 5) keys += ", ...";
    if (tokenizer_config) {
        return "it is a tokenizer_config.json (pass the tokenizer.json beside it)";
    }
    if (config) return "it is a model's config.json (pass the tokenizer.json beside it)";
    if (n == 0) return "it is an empty JSON object";
    return fmt::format("it is a JSON object without a \"model\" key (its keys: {})", keys);
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
    int64_t vocab_size = 0;

    Status encode_segment(std::string_view segment, bool at_origin, EncodeContext& ctx,
                          std::vector<int32_t>& ids) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        const std::filesystem::path inside = std::filesystem::path(path) / "tokenizer.json";
        if (std::filesystem::is_regular_file(inside, ec)) {
            return not_a_tokenizer(
                path,
                fmt::format("it is a directory (pass the file {} it holds)", inside.string()));
        }
        return not_a_tokenizer(path, "it is a directory");
    }
    LATHE_ASSIGN_OR_RETURN(std::string text, file_read_all(path));
    return from_json(text, path);
}

Result<Tokenizer> Tokenizer::from_json(std::string_view json_text, const std::string& source_name) {
    auto impl = std::make_unique<Impl>();
    impl->source = source_name;
    impl->serial = g_next_serial.fetch_add(1);
    simdjson::dom::parser parser;
    // First the kind of file: a JSON object with a "model" object.
    if (json_text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
        return not_a_tokenizer(source_name, json_text.empty() ? "the file is empty"
                                                              : "the file holds only white space");
    }
    simdjson::dom::element root_element;
    if (const simdjson::error_code err =
            parser.parse(json_text.data(), json_text.size(), true).get(root_element);
        err != simdjson::SUCCESS) {
        if (err == simdjson::NUMBER_ERROR) {
            if (std::optional<std::string> near = near_long_integer(json_text)) {
                return invalid_argument_error(
                    "{}: the integer in '{}' does not fit 64 bits; Hugging Face tokenizers "
                    "refuses it too (token ids are integers from 0 to 2^32 - 1; lathe's from 0 "
                    "to 2^31 - 1)",
                    source_name, *near);
            }
        }
        return not_a_tokenizer(source_name, describe_non_json(parser, json_text, err));
    }
    simdjson::dom::object root_object;
    if (root_element.get_object().get(root_object) != simdjson::SUCCESS) {
        return not_a_tokenizer(source_name,
                               fmt::format("it holds a JSON {}, not an object",
                                           JsonNode(root_element, "", &impl->source).type_name()));
    }
    simdjson::dom::element model_element;
    if (root_object.at_key("model").get(model_element) != simdjson::SUCCESS) {
        return not_a_tokenizer(source_name, describe_object_without_model(root_object));
    }
    if (!model_element.is_object()) {
        return not_a_tokenizer(
            source_name, fmt::format("its \"model\" is a JSON {}, not an object",
                                     JsonNode(model_element, "model", &impl->source).type_name()));
    }
    const JsonNode root(root_element, "", &impl->source);
    const JsonNode model(model_element, "model", &impl->source);
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
    Status normalize_error;  // the first added token the normalizer fails on
    impl->added.add_tokens(
        added, [bpe](std::string_view s) { return bpe->token_to_id(s); }, bpe->vocab_entries(),
        [normalizer, &normalize_error, &source_name](const std::string& s) -> std::string {
            if (normalizer == nullptr) return s;
            Result<std::string> n = normalizer->normalize_to_string(s);
            if (n.ok()) return std::move(n).value();
            if (normalize_error.ok()) {
                normalize_error = n.status().with_context(fmt::format(
                    "{}: added token '{}': normalizer", source_name, escape_for_message(s, 60)));
            }
            return s;
        });
    LATHE_RETURN_IF_ERROR(normalize_error);
    impl->vocab_size = int64_t{std::max(bpe->max_id(), impl->added.max_id())} + 1;
    return Tokenizer(std::move(impl));
}

Status Tokenizer::Impl::encode_segment(std::string_view segment, bool at_origin, EncodeContext& ctx,
                                       std::vector<int32_t>& ids) const {
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
        return invalid_argument_error(
            "text is not valid UTF-8 (invalid byte 0x{:02X} at offset {})",
            static_cast<uint8_t>(text[at]), at);
    }
    // A pre-tokenizer's regex can give up on a text (regex.h: RegexLimitExceeded; a normalizer
    // returns it as a Status): that text's error, not the process's.
    try {
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
                Result<bool> kept_origin = im.normalizer->normalize(segment, ctx.normalized);
                if (!kept_origin.ok()) {
                    ids.clear();
                    return kept_origin.status();
                }
                at_origin = *kept_origin && at_origin;
                segment = ctx.normalized;
            }
            if (!im.added.has_normalized_tokens()) {
                if (!segment.empty())
                    LATHE_RETURN_IF_ERROR(im.encode_segment(segment, at_origin, ctx, ids));
                continue;
            }
            ctx.normalized_splits.clear();
            im.added.split(segment, /*normalized=*/true, ctx.normalized_splits);
            for (const AddedSplit& ns : ctx.normalized_splits) {
                if (ns.id >= 0) {
                    ids.push_back(ns.id);
                } else if (ns.begin != ns.end) {
                    LATHE_RETURN_IF_ERROR(
                        im.encode_segment(segment.substr(ns.begin, ns.end - ns.begin),
                                          at_origin && ns.begin == 0, ctx, ids));
                }
            }
        }
        if (add_special && im.post_processor) im.post_processor->apply(ids, ctx.post_scratch);
        return ok_status();
    } catch (const RegexLimitExceeded& e) {
        ids.clear();
        return regex_limit_text_error(e);
    }
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
            return invalid_argument_error(
                "id {} (position {}) is not in the vocabulary of {} "
                "(ids run from 0 to {})",
                id, i, im.source, im.vocab_size - 1);
        }
        if (skip_special && im.added.is_special_string(*t)) continue;
        tokens.emplace_back(*t);
    }
    if (im.decoder) {
        Result<std::string> text = im.decoder->decode(std::move(tokens));
        if (!text.ok()) return text.status().with_context(im.source);
        return text;
    }
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (i > 0) out += ' ';
        out += tokens[i];
    }
    return out;
}

int64_t Tokenizer::vocab_size() const {
    return impl_->vocab_size;
}

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
