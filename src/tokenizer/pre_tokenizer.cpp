#include "tokenizer/pre_tokenizer.h"

#include <fmt/format.h>

#include <array>

#include "core/check.h"
#include "core/strings.h"
#include "tokenizer/components.h"
#include "tokenizer/scratch.h"
#include "tokenizer/utf8.h"

namespace lathe {

// ---------------------------------------------------------------------------------------------
// ByteLevel alphabet

namespace {

struct ByteLevelTables {
    std::array<char32_t, 256> chars{};
    std::array<std::array<char, 2>, 256> utf8{};
    std::array<uint8_t, 256> utf8_len{};
    // code point -> byte + 1 (0: not a symbol); symbols are all below U+0144.
    std::array<uint16_t, 0x144> reverse{};

    ByteLevelTables() {
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable =
                (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            chars[b] = printable ? char32_t(b) : char32_t(256 + n++);
        }
        for (int b = 0; b < 256; ++b) {
            const std::string s = utf8::encode(chars[b]);
            utf8_len[b] = static_cast<uint8_t>(s.size());
            for (size_t i = 0; i < s.size(); ++i) utf8[b][i] = s[i];
            reverse[chars[b]] = static_cast<uint16_t>(b + 1);
        }
    }
};

const ByteLevelTables& byte_level_tables() {
    static const ByteLevelTables tables;
    return tables;
}

}  // namespace

char32_t byte_level_char(uint8_t byte) {
    return byte_level_tables().chars[byte];
}

std::string_view byte_level_symbol(uint8_t byte) {
    const ByteLevelTables& t = byte_level_tables();
    return std::string_view(t.utf8[byte].data(), t.utf8_len[byte]);
}

std::optional<uint8_t> byte_level_byte(char32_t cp) {
    const ByteLevelTables& t = byte_level_tables();
    if (cp >= t.reverse.size() || t.reverse[cp] == 0) return std::nullopt;
    return static_cast<uint8_t>(t.reverse[cp] - 1);
}

void byte_level_encode(std::string_view bytes, std::string& out) {
    const ByteLevelTables& t = byte_level_tables();
    const size_t old = out.size();
    out.resize(old + 2 * bytes.size());
    char* w = out.data() + old;
    for (char c : bytes) {
        const auto b = static_cast<uint8_t>(c);
        w[0] = t.utf8[b][0];
        w[1] = t.utf8[b][1];
        w += t.utf8_len[b];
    }
    out.resize(static_cast<size_t>(w - out.data()));
}

bool byte_level_decode(std::string_view symbols, std::string& out) {
    if (!utf8::is_valid(symbols)) return false;
    const size_t old = out.size();
    size_t i = 0;
    while (i < symbols.size()) {
        int len;
        const char32_t c = utf8::decode(symbols, i, &len);
        const std::optional<uint8_t> b = byte_level_byte(c);
        if (!b) {
            out.resize(old);
            return false;
        }
        out.push_back(static_cast<char>(*b));
        i += static_cast<size_t>(len);
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Splitting machinery shared by the pre-tokenizers (HF NormalizedString::split + Pattern).

Status PreTokenizer::split(std::string_view normalized_text, PieceList& pieces, PieceList& scratch,
                           bool at_origin) const {
    pieces.clear();
    pieces.add(normalized_text, at_origin);
    try {
        pre_tokenize(pieces, scratch);
    } catch (const RegexLimitExceeded& e) {
        pieces.clear();
        return regex_limit_text_error(e);
    }
    return ok_status();
}

Result<std::vector<std::string>> PreTokenizer::split_to_strings(
    std::string_view normalized_text) const {
    PieceList pieces, scratch;
    LATHE_RETURN_IF_ERROR(split(normalized_text, pieces, scratch));
    std::vector<std::string> out;
    out.reserve(pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) out.emplace_back(pieces.view(i));
    return out;
}

namespace {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Result<SplitBehavior> split_behavior_from_node(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view name, node.as_string());
    if (name == "Removed") return SplitBehavior::kRemoved;
    if (name == "Isolated") return SplitBehavior::kIsolated;
    if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (name == "Contiguous") return SplitBehavior::kContiguous;
    static const std::vector<std::string> names = {"Removed", "Isolated", "MergedWithPrevious",
                                                   "MergedWithNext", "Contiguous"};
    return node.error(fmt::format("unknown split behavior '{}'{}; expected one of {}", name,
                                  did_you_mean(name, names), fmt::join(names, ", ")));
}

// One span of HF's Pattern::find_matches: [begin, end) and whether it is a match.
struct Span {
    uint32_t begin;
    uint32_t end;
    bool match;
};

// HF Pattern for &SysRegex: the matches and the gaps between them, covering `text` (non-empty).
void regex_spans(const Regex& regex, std::string_view text, std::vector<Span>& spans) {
    uint32_t prev = 0;
    regex.find_iter(text, [&](size_t b, size_t e) {
        if (prev != b) spans.push_back(Span{prev, static_cast<uint32_t>(b), false});
        spans.push_back(Span{static_cast<uint32_t>(b), static_cast<uint32_t>(e), true});
        prev = static_cast<uint32_t>(e);
    });
    if (prev != text.size()) spans.push_back(Span{prev, static_cast<uint32_t>(text.size()), false});
}

// HF Pattern for Fn(char) -> bool: every matching character is its own match.
template <typename Pred>
void char_spans(std::string_view text, Pred pred, std::vector<Span>& spans) {
    uint32_t last = 0;
    size_t i = 0;
    while (i < text.size()) {
        int len;
        const char32_t c = utf8::decode(text, i, &len);
        const auto b = static_cast<uint32_t>(i);
        i += static_cast<size_t>(len);
        if (pred(c)) {
            if (last < b) spans.push_back(Span{last, b, false});
            spans.push_back(Span{b, static_cast<uint32_t>(i), true});
            last = static_cast<uint32_t>(i);
        }
    }
    if (last < text.size()) spans.push_back(Span{last, static_cast<uint32_t>(text.size()), false});
}

// HF NormalizedString::split: applies `behavior` to `spans` (inverted first when `invert`) and
// appends the resulting non-empty sub-pieces of `text` to `out`.
void emit_split(std::string_view text, bool at_origin, std::vector<Span>& spans,
                SplitBehavior behavior, bool invert, PieceList& out) {
    if (invert) {
        for (Span& s : spans) s.match = !s.match;
    }
    auto emit = [&](uint32_t b, uint32_t e) {
        out.add(text.substr(b, e - b), at_origin && b == 0);
    };
    switch (behavior) {
        case SplitBehavior::kIsolated:
            for (const Span& s : spans) emit(s.begin, s.end);
            return;
        case SplitBehavior::kRemoved:
            for (const Span& s : spans) {
                if (!s.match) emit(s.begin, s.end);
            }
            return;
        case SplitBehavior::kContiguous:
        case SplitBehavior::kMergedWithPrevious: {
            // Merge in place, then emit.
            size_t n = 0;
            bool previous_match = false;
            for (size_t i = 0; i < spans.size(); ++i) {
                const Span s = spans[i];  // a copy: spans[n] below may be this very element
                const bool merge = behavior == SplitBehavior::kContiguous
                                       ? s.match == previous_match
                                       : (s.match && !previous_match);
                if (merge && n > 0) {
                    spans[n - 1].end = s.end;
                } else {
                    spans[n++] = Span{s.begin, s.end, false};
                }
                previous_match = s.match;
            }
            for (size_t i = 0; i < n; ++i) emit(spans[i].begin, spans[i].end);
            return;
        }
        case SplitBehavior::kMergedWithNext: {
            // Walk backwards, merging a match into the span after it; the merged spans end up in
            // [w, size) in order.
            size_t w = spans.size();
            bool previous_match = false;
            for (size_t r = spans.size(); r-- > 0;) {
                const Span s = spans[r];
                if (s.match && !previous_match && w < spans.size()) {
                    spans[w].begin = s.begin;
                } else {
                    spans[--w] = Span{s.begin, s.end, false};
                }
                previous_match = s.match;
            }
            for (size_t i = w; i < spans.size(); ++i) emit(spans[i].begin, spans[i].end);
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

// Applies fn(text, at_origin, out) to each piece, collecting into scratch, then swaps back.
template <typename Fn>
void for_each_piece(PieceList& pieces, PieceList& scratch, Fn fn) {
    scratch.clear();
    for (size_t i = 0; i < pieces.size(); ++i)
        fn(pieces.view(i), pieces.piece(i).at_origin, scratch);
    pieces.swap(scratch);
}

class SplitPreTokenizer final : public PreTokenizer {
public:
    SplitPreTokenizer(Regex regex, SplitBehavior behavior, bool invert)
        : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

    void pre_tokenize(PieceList& pieces, PieceList& scratch) const override {
        for_each_piece(pieces, scratch, [&](std::string_view text, bool at_origin, PieceList& out) {
            if (behavior_ == SplitBehavior::kIsolated) {
                // Every match and every gap is a piece, whatever `invert` says.
                size_t prev = 0;
                regex_.find_iter(text, [&](size_t b, size_t e) {
                    out.add(text.substr(prev, b - prev), at_origin && prev == 0);
                    out.add(text.substr(b, e - b), at_origin && b == 0);
                    prev = e;
                });
                out.add(text.substr(prev), at_origin && prev == 0);
                return;
            }
            Scratch<std::vector<Span>> spans;
            regex_spans(regex_, text, *spans);
            emit_split(text, at_origin, *spans, behavior_, invert_, out);
        });
    }

private:
    Regex regex_;
    SplitBehavior behavior_;
    bool invert_;
};

// Splits on single characters chosen by a predicate (Digits, Punctuation, WhitespaceSplit,
// CharDelimiterSplit).
template <typename Pred>
class CharSplitPreTokenizer final : public PreTokenizer {
public:
    CharSplitPreTokenizer(Pred pred, SplitBehavior behavior) : pred_(pred), behavior_(behavior) {}
    void pre_tokenize(PieceList& pieces, PieceList& scratch) const override {
        for_each_piece(pieces, scratch, [&](std::string_view text, bool at_origin, PieceList& out) {
            Scratch<std::vector<Span>> spans;
            char_spans(text, pred_, *spans);
            emit_split(text, at_origin, *spans, behavior_, false, out);
        });
    }

private:
    Pred pred_;
    SplitBehavior behavior_;
};

template <typename Pred>
std::unique_ptr<PreTokenizer> make_char_split(Pred pred, SplitBehavior behavior) {
    return std::make_unique<CharSplitPreTokenizer<Pred>>(pred, behavior);
}

bool is_ascii_punctuation(char32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}

// GPT-2's split pattern, as HF's ByteLevel pre-tokenizer writes it (Oniguruma syntax).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
public:
    ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> regex)
        : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

    void pre_tokenize(PieceList& pieces, PieceList& scratch) const override {
        for_each_piece(pieces, scratch, [&](std::string_view text, bool at_origin, PieceList& out) {
            ScratchString prefixed;
            if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
                prefixed->push_back(' ');
                prefixed->append(text);
                text = *prefixed;
            }
            auto emit = [&](size_t b, size_t e) {
                const size_t begin = out.text().size();
                byte_level_encode(text.substr(b, e - b), out.text());
                out.close_piece(begin, at_origin && b == 0);
            };
            if (!regex_) {
                emit(0, text.size());
                return;
            }
            size_t prev = 0;
            regex_->find_iter(text, [&](size_t b, size_t e) {
                emit(prev, b);
                emit(b, e);
                prev = e;
            });
            emit(prev, text.size());
        });
    }

private:
    bool add_prefix_space_;
    std::optional<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
public:
    MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
        : replacement_(replacement),
          replacement_utf8_(utf8::encode(replacement)),
          scheme_(scheme),
          split_(split) {}

    void pre_tokenize(PieceList& pieces, PieceList& scratch) const override {
        for_each_piece(pieces, scratch, [&](std::string_view text, bool at_origin, PieceList& out) {
            ScratchString replaced;
            const bool starts_with_replacement =
                (!text.empty() && text[0] == ' ') ||
                (text.size() >= replacement_utf8_.size() &&
                 text.substr(0, replacement_utf8_.size()) == replacement_utf8_);
            const bool prepend =
                !starts_with_replacement && (scheme_ == PrependScheme::kAlways ||
                                             (scheme_ == PrependScheme::kFirst && at_origin));
            if (prepend) replaced->append(replacement_utf8_);
            for (char c : text) {
                if (c == ' ') {
                    replaced->append(replacement_utf8_);
                } else {
                    replaced->push_back(c);
                }
            }
            // Only a non-empty text gets the prefix (HF prepends before the first character).
            std::string_view r = text.empty() ? std::string_view() : std::string_view(*replaced);
            if (!split_) {
                out.add(r, at_origin);
                return;
            }
            Scratch<std::vector<Span>> spans;
            const char32_t rep = replacement_;
            char_spans(
                r, [rep](char32_t c) { return c == rep; }, *spans);
            emit_split(r, at_origin, *spans, SplitBehavior::kMergedWithNext, false, out);
        });
    }

private:
    char32_t replacement_;
    std::string replacement_utf8_;
    PrependScheme scheme_;
    bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
public:
    explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
        : steps_(std::move(steps)) {}
    void pre_tokenize(PieceList& pieces, PieceList& scratch) const override {
        for (const auto& step : steps_) step->pre_tokenize(pieces, scratch);
    }

private:
    std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

const std::vector<std::string>& pre_tokenizer_type_names() {
    static const std::vector<std::string> names = {
        "ByteLevel",          "Split",           "Metaspace",   "Digits",
        "Whitespace",         "WhitespaceSplit", "Punctuation", "BertPreTokenizer",
        "CharDelimiterSplit", "Sequence"};
    return names;
}

Result<char32_t> single_char(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view s, node.as_string());
    if (s.empty() || !utf8::is_valid(s) || utf8::count_chars(s) != 1) {
        return node.error(
            fmt::format("expected a single character, got '{}'", escape_for_message(s)));
    }
    int len;
    return utf8::decode(s, 0, &len);
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> pre_tokenizer_from_node(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view type, component_type(node));
    using P = std::unique_ptr<PreTokenizer>;
    if (type == "ByteLevel") {
        LATHE_ASSIGN_OR_RETURN(bool add_prefix_space, node.get_bool("add_prefix_space", true));
        LATHE_ASSIGN_OR_RETURN(bool use_regex, node.get_bool("use_regex", true));
        std::optional<Regex> regex;
        if (use_regex) {
            Result<Regex> r = Regex::from_oniguruma(kGpt2Pattern);
            LATHE_CHECK(r.ok(), "built-in GPT-2 pattern: {}", r.status().message());
            regex.emplace(std::move(r).value());
        }
        return P(new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
    }
    if (type == "Split") {
        LATHE_ASSIGN_OR_RETURN(JsonNode pattern, node.required("pattern"));
        LATHE_ASSIGN_OR_RETURN(Regex regex, regex_from_pattern_node(pattern));
        LATHE_ASSIGN_OR_RETURN(JsonNode behavior_node, node.required("behavior"));
        LATHE_ASSIGN_OR_RETURN(SplitBehavior behavior, split_behavior_from_node(behavior_node));
        LATHE_ASSIGN_OR_RETURN(bool invert, node.get_bool("invert", false));
        return P(new SplitPreTokenizer(std::move(regex), behavior, invert));
    }
    if (type == "Metaspace") {
        char32_t replacement = 0x2581;
        if (std::optional<JsonNode> r = node.field("replacement"); r && !r->is_null()) {
            LATHE_ASSIGN_OR_RETURN(replacement, single_char(*r));
        }
        PrependScheme scheme = PrependScheme::kAlways;
        if (std::optional<JsonNode> s = node.field("prepend_scheme"); s && !s->is_null()) {
            LATHE_ASSIGN_OR_RETURN(std::string_view name, s->as_string());
            if (name == "always") {
                scheme = PrependScheme::kAlways;
            } else if (name == "first") {
                scheme = PrependScheme::kFirst;
            } else if (name == "never") {
                scheme = PrependScheme::kNever;
            } else {
                return s->error(fmt::format(
                    "unknown prepend_scheme '{}'; expected always, first or never", name));
            }
        }
        // Legacy files carry add_prefix_space instead; false means "never" (HF's rule).
        if (std::optional<JsonNode> a = node.field("add_prefix_space"); a && !a->is_null()) {
            LATHE_ASSIGN_OR_RETURN(bool add, a->as_bool());
            if (!add) {
                // HF's rule: prepend_scheme (default "always") must then say "never".
                if (scheme != PrependScheme::kNever) {
                    return a->error(
                        "add_prefix_space false does not match prepend_scheme (set "
                        "\"prepend_scheme\": \"never\")");
                }
            }
        }
        LATHE_ASSIGN_OR_RETURN(bool split, node.get_bool("split", true));
        return P(new MetaspacePreTokenizer(replacement, scheme, split));
    }
    if (type == "Digits") {
        LATHE_ASSIGN_OR_RETURN(bool individual, node.get_bool("individual_digits", false));
        return make_char_split([](char32_t c) { return utf8::is_numeric(c); },
                               individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous);
    }
    if (type == "Whitespace") {
        // HF: Rust regex \w+|[^\w\s]+ (Unicode \w, \s), keeping the matches.
        Result<Regex> r = Regex::from_pcre2(
            R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|)"
            R"([^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)");
        LATHE_CHECK(r.ok(), "built-in Whitespace pattern: {}", r.status().message());
        return P(new SplitPreTokenizer(std::move(r).value(), SplitBehavior::kRemoved, true));
    }
    if (type == "WhitespaceSplit") {
        return make_char_split([](char32_t c) { return utf8::is_whitespace(c); },
                               SplitBehavior::kRemoved);
    }
    if (type == "Punctuation") {
        SplitBehavior behavior = SplitBehavior::kIsolated;
        if (std::optional<JsonNode> b = node.field("behavior"); b && !b->is_null()) {
            LATHE_ASSIGN_OR_RETURN(behavior, split_behavior_from_node(*b));
        }
        return make_char_split(
            [](char32_t c) { return is_ascii_punctuation(c) || utf8::is_punctuation(c); },
            behavior);
    }
    if (type == "BertPreTokenizer") {
        std::vector<P> steps;
        steps.push_back(make_char_split([](char32_t c) { return utf8::is_whitespace(c); },
                                        SplitBehavior::kRemoved));
        steps.push_back(make_char_split(
            [](char32_t c) { return is_ascii_punctuation(c) || utf8::is_punctuation(c); },
            SplitBehavior::kIsolated));
        return P(new SequencePreTokenizer(std::move(steps)));
    }
    if (type == "CharDelimiterSplit" || type == "Delimiter") {
        LATHE_ASSIGN_OR_RETURN(JsonNode d, node.required("delimiter"));
        LATHE_ASSIGN_OR_RETURN(char32_t delimiter, single_char(d));
        return make_char_split([delimiter](char32_t c) { return c == delimiter; },
                               SplitBehavior::kRemoved);
    }
    if (type == "Sequence") {
        LATHE_ASSIGN_OR_RETURN(JsonNode list, node.required("pretokenizers"));
        LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, list.as_array());
        std::vector<P> steps;
        for (const JsonNode& item : items) {
            LATHE_ASSIGN_OR_RETURN(P step, pre_tokenizer_from_node(item));
            steps.push_back(std::move(step));
        }
        return P(new SequencePreTokenizer(std::move(steps)));
    }
    if (type == "UnicodeScripts" || type == "FixedLength") {
        return Status(StatusCode::kUnimplemented,
                      fmt::format("{}: {}: pre-tokenizer type '{}' is not supported by lathe",
                                  node.source(), node.path(), type));
    }
    return node.error(fmt::format("unknown pre-tokenizer type '{}'{}; supported: {}", type,
                                  did_you_mean(type, pre_tokenizer_type_names()),
                                  fmt::join(pre_tokenizer_type_names(), ", ")));
}

Result<std::unique_ptr<PreTokenizer>> pre_tokenizer_from_json(std::string_view json_text,
                                                              const std::string& source_name) {
    simdjson::dom::parser parser;
    LATHE_ASSIGN_OR_RETURN(JsonNode root,
                           json_parse_root(parser, json_text, &source_name, "pre_tokenizer"));
    return pre_tokenizer_from_node(root);
}

}  // namespace lathe
