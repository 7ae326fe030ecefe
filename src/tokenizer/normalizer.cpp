#include "tokenizer/normalizer.h"

#include <fmt/format.h>

#include <vector>

#include "core/strings.h"
#include "tokenizer/components.h"
#include "tokenizer/scratch.h"
#include "tokenizer/utf8.h"

namespace lathe {

Result<std::string> Normalizer::normalize_to_string(std::string_view text) const {
    std::string out;
    LATHE_RETURN_IF_ERROR(normalize(text, out).status());
    return out;
}

namespace {

class UnicodeNormalizer final : public Normalizer {
public:
    explicit UnicodeNormalizer(utf8::NormalForm form) : form_(form) {}
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        utf8::append_normalized(out, text, form_);
        return true;
    }

private:
    utf8::NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
public:
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        out.reserve(out.size() + text.size());
        size_t i = 0;
        while (i < text.size()) {
            int len;
            const char32_t c = utf8::decode(text, i, &len);
            utf8::append_lowercase(out, c);
            i += static_cast<size_t>(len);
        }
        return true;
    }
};

// HF NormalizedString::lrstrip: removes leading and/or trailing White_Space characters.
class StripNormalizer final : public Normalizer {
public:
    StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        size_t begin = 0, end = text.size();
        if (left_) {
            while (begin < end) {
                int len;
                if (!utf8::is_whitespace(utf8::decode(text, begin, &len))) break;
                begin += static_cast<size_t>(len);
            }
        }
        if (right_) {
            while (end > begin) {
                size_t start = end - 1;
                while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
                int len;
                if (!utf8::is_whitespace(utf8::decode(text, start, &len))) break;
                end = start;
            }
        }
        out.append(text.substr(begin, end - begin));
        return begin == 0;
    }

private:
    bool left_, right_;
};

// Appends the characters of `text` for which keep(c) holds; returns whether the first character
// was kept (or text is empty).
template <typename Keep>
bool filter_chars(std::string_view text, std::string& out, Keep keep) {
    bool first_kept = true;
    size_t i = 0;
    while (i < text.size()) {
        int len;
        const char32_t c = utf8::decode(text, i, &len);
        if (keep(c)) {
            out.append(text.substr(i, static_cast<size_t>(len)));
        } else if (i == 0) {
            first_kept = false;
        }
        i += static_cast<size_t>(len);
    }
    return first_kept;
}

class StripAccentsNormalizer final : public Normalizer {
public:
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        return filter_chars(text, out, [](char32_t c) { return !utf8::is_mark_unicode9(c); });
    }
};

// Every non-overlapping match (Oniguruma find_iter order) replaced by `content`.
class ReplaceNormalizer final : public Normalizer {
public:
    ReplaceNormalizer(Regex regex, std::string content)
        : regex_(std::move(regex)), content_(std::move(content)) {}
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        size_t prev = 0;
        bool at_origin = true;
        try {
            regex_.find_iter(text, [&](size_t b, size_t e) {
                if (b == 0 && e > 0 && content_.empty()) at_origin = false;
                out.append(text.substr(prev, b - prev));
                out.append(content_);
                prev = e;
            });
        } catch (const RegexLimitExceeded& e) {
            return regex_limit_text_error(e);
        }
        out.append(text.substr(prev));
        return at_origin;
    }

private:
    Regex regex_;
    std::string content_;
};

class PrependNormalizer final : public Normalizer {
public:
    explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        if (!text.empty()) out.append(prefix_);
        out.append(text);
        return true;
    }

private:
    std::string prefix_;
};

class ByteLevelNormalizer final : public Normalizer {
public:
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        byte_level_encode(text, out);
        return true;
    }
};

// SentencePiece's nmt_nfkc clean-up (HF normalizers::Nmt): drops some control characters, maps
// others (and a few spaces) to ' '.
class NmtNormalizer final : public Normalizer {
public:
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        bool first_kept = true;
        size_t i = 0;
        while (i < text.size()) {
            int len;
            const char32_t c = utf8::decode(text, i, &len);
            const bool drop = (c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) ||
                              c == 0x7F || c == 0x8F || c == 0x9F;
            if (drop) {
                if (i == 0) first_kept = false;
            } else if (c == 0x09 || c == 0x0A || c == 0x0C || c == 0x0D || c == 0x1680 ||
                       (c >= 0x200B && c <= 0x200F) || c == 0x2028 || c == 0x2029 || c == 0x2581 ||
                       c == 0xFEFF || c == 0xFFFD) {
                out.push_back(' ');
            } else {
                out.append(text.substr(i, static_cast<size_t>(len)));
            }
            i += static_cast<size_t>(len);
        }
        return first_kept;
    }
};

// HF normalizers::BertNormalizer, step for step.
class BertNormalizer final : public Normalizer {
public:
    BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase)
        : clean_text_(clean_text),
          handle_chinese_chars_(handle_chinese_chars),
          strip_accents_(strip_accents),
          lowercase_(lowercase) {}

    Result<bool> normalize(std::string_view text, std::string& out) const override {
        ScratchString a, b;
        bool at_origin = true;
        std::string_view cur = text;
        if (clean_text_) {
            size_t i = 0;
            while (i < cur.size()) {
                int len;
                const char32_t c = utf8::decode(cur, i, &len);
                const bool tab_nl_cr = c == '\t' || c == '\n' || c == '\r';
                if (c == 0 || c == 0xFFFD || (!tab_nl_cr && utf8::is_control_category(c))) {
                    if (i == 0) at_origin = false;
                } else if (tab_nl_cr || utf8::is_whitespace(c)) {
                    a->push_back(' ');
                } else {
                    a->append(cur.substr(i, static_cast<size_t>(len)));
                }
                i += static_cast<size_t>(len);
            }
            cur = *a;
        }
        if (handle_chinese_chars_) {
            b->clear();
            size_t i = 0;
            while (i < cur.size()) {
                int len;
                const char32_t c = utf8::decode(cur, i, &len);
                if (utf8::is_chinese_char(c)) {
                    b->push_back(' ');
                    b->append(cur.substr(i, static_cast<size_t>(len)));
                    b->push_back(' ');
                } else {
                    b->append(cur.substr(i, static_cast<size_t>(len)));
                }
                i += static_cast<size_t>(len);
            }
            a->swap(*b);
            cur = *a;
        }
        if (strip_accents_) {
            b->clear();
            utf8::append_normalized(*b, cur, utf8::NormalForm::kNfd);
            std::string filtered;
            if (!filter_chars(*b, filtered,
                              [](char32_t c) { return !utf8::is_mark_nonspacing_unicode9(c); })) {
                at_origin = false;
            }
            a->swap(filtered);
            cur = *a;
        }
        if (lowercase_) {
            size_t i = 0;
            while (i < cur.size()) {
                int len;
                utf8::append_lowercase(out, utf8::decode(cur, i, &len));
                i += static_cast<size_t>(len);
            }
        } else {
            out.append(cur);
        }
        return at_origin;
    }

private:
    bool clean_text_, handle_chinese_chars_, strip_accents_, lowercase_;
};

class SequenceNormalizer final : public Normalizer {
public:
    explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
        : steps_(std::move(steps)) {}
    Result<bool> normalize(std::string_view text, std::string& out) const override {
        if (steps_.empty()) {
            out.append(text);
            return true;
        }
        ScratchString a, b;
        bool at_origin = true;
        std::string_view cur = text;
        for (size_t i = 0; i + 1 < steps_.size(); ++i) {
            b->clear();
            LATHE_ASSIGN_OR_RETURN(const bool kept, steps_[i]->normalize(cur, *b));
            at_origin = kept && at_origin;
            a->swap(*b);
            cur = *a;
        }
        LATHE_ASSIGN_OR_RETURN(const bool kept, steps_.back()->normalize(cur, out));
        return kept && at_origin;
    }

private:
    std::vector<std::unique_ptr<Normalizer>> steps_;
};

const std::vector<std::string>& normalizer_type_names() {
    static const std::vector<std::string> names = {
        "NFC",     "NFD",     "NFKC",           "NFKD",      "Lowercase", "Strip",   "StripAccents",
        "Replace", "Prepend", "BertNormalizer", "ByteLevel", "Nmt",       "Sequence"};
    return names;
}

}  // namespace

Result<std::string_view> component_type(const JsonNode& node) {
    LATHE_RETURN_IF_ERROR(node.expect_object());
    std::optional<JsonNode> type = node.field("type");
    if (!type) return node.error("missing field 'type'");
    return type->as_string();
}

Result<Regex> regex_from_pattern_node(const JsonNode& node) {
    LATHE_RETURN_IF_ERROR(node.expect_object());
    if (std::optional<JsonNode> s = node.field("String")) {
        LATHE_ASSIGN_OR_RETURN(std::string_view literal, s->as_string());
        return Regex::from_literal(literal);
    }
    if (std::optional<JsonNode> r = node.field("Regex")) {
        LATHE_ASSIGN_OR_RETURN(std::string_view pattern, r->as_string());
        Result<Regex> regex = Regex::from_oniguruma(pattern);
        if (!regex.ok()) return r->error(regex.status().message());
        return regex;
    }
    return node.error("expected {\"String\": ...} or {\"Regex\": ...}");
}

Result<std::unique_ptr<Normalizer>> normalizer_from_node(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view type, component_type(node));
    using P = std::unique_ptr<Normalizer>;
    if (type == "NFC") return P(new UnicodeNormalizer(utf8::NormalForm::kNfc));
    if (type == "NFD") return P(new UnicodeNormalizer(utf8::NormalForm::kNfd));
    if (type == "NFKC") return P(new UnicodeNormalizer(utf8::NormalForm::kNfkc));
    if (type == "NFKD") return P(new UnicodeNormalizer(utf8::NormalForm::kNfkd));
    if (type == "Lowercase") return P(new LowercaseNormalizer());
    if (type == "StripAccents") return P(new StripAccentsNormalizer());
    if (type == "ByteLevel") return P(new ByteLevelNormalizer());
    if (type == "Nmt") return P(new NmtNormalizer());
    if (type == "Strip") {
        LATHE_ASSIGN_OR_RETURN(bool left, node.get_bool("strip_left", true));
        LATHE_ASSIGN_OR_RETURN(bool right, node.get_bool("strip_right", true));
        return P(new StripNormalizer(left, right));
    }
    if (type == "Replace") {
        LATHE_ASSIGN_OR_RETURN(JsonNode pattern, node.required("pattern"));
        LATHE_ASSIGN_OR_RETURN(Regex regex, regex_from_pattern_node(pattern));
        LATHE_ASSIGN_OR_RETURN(JsonNode content_node, node.required("content"));
        LATHE_ASSIGN_OR_RETURN(std::string_view content, content_node.as_string());
        return P(new ReplaceNormalizer(std::move(regex), std::string(content)));
    }
    if (type == "Prepend") {
        LATHE_ASSIGN_OR_RETURN(JsonNode prepend_node, node.required("prepend"));
        LATHE_ASSIGN_OR_RETURN(std::string_view prepend, prepend_node.as_string());
        return P(new PrependNormalizer(std::string(prepend)));
    }
    if (type == "BertNormalizer") {
        LATHE_ASSIGN_OR_RETURN(bool clean_text, node.get_bool("clean_text", true));
        LATHE_ASSIGN_OR_RETURN(bool chinese, node.get_bool("handle_chinese_chars", true));
        LATHE_ASSIGN_OR_RETURN(bool lowercase, node.get_bool("lowercase", true));
        // strip_accents: null means "same as lowercase" (BERT's uncased models).
        LATHE_ASSIGN_OR_RETURN(bool strip_accents, node.get_bool("strip_accents", lowercase));
        return P(new BertNormalizer(clean_text, chinese, strip_accents, lowercase));
    }
    if (type == "Sequence") {
        LATHE_ASSIGN_OR_RETURN(JsonNode list, node.required("normalizers"));
        LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, list.as_array());
        std::vector<std::unique_ptr<Normalizer>> steps;
        for (const JsonNode& item : items) {
            LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> step, normalizer_from_node(item));
            steps.push_back(std::move(step));
        }
        return P(new SequenceNormalizer(std::move(steps)));
    }
    if (type == "Precompiled") {
        return Status(StatusCode::kUnimplemented,
                      fmt::format("{}: {}: normalizer type 'Precompiled' (a SentencePiece "
                                  "charsmap) is not supported by lathe",
                                  node.source(), node.path()));
    }
    return node.error(fmt::format("unknown normalizer type '{}'{}; supported: {}", type,
                                  did_you_mean(type, normalizer_type_names()),
                                  fmt::join(normalizer_type_names(), ", ")));
}

Result<std::unique_ptr<Normalizer>> normalizer_from_json(std::string_view json_text,
                                                         const std::string& source_name) {
    simdjson::dom::parser parser;
    LATHE_ASSIGN_OR_RETURN(JsonNode root,
                           json_parse_root(parser, json_text, &source_name, "normalizer"));
    return normalizer_from_node(root);
}

}  // namespace lathe
