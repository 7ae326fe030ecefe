#include "tokenizer/decoder.h"

#include <fmt/format.h>

#include "core/strings.h"
#include "tokenizer/components.h"
#include "tokenizer/utf8.h"

namespace lathe {

Result<std::string> Decoder::decode(std::vector<std::string> tokens) const {
    try {
        decode_chain(tokens);
    } catch (const RegexLimitExceeded& e) {
        return invalid_argument_error(
            "decoder: {}; decode fewer ids at a time, or simplify the decoder's Replace pattern "
            "in the tokenizer.json",
            e.what());
    }
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
}

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

class ByteLevelDecoder final : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string bytes;
        for (const std::string& t : tokens) {
            if (!byte_level_decode(t, bytes)) bytes += t;
        }
        std::string text;
        utf8::append_lossy(text, bytes);
        tokens.assign(1, std::move(text));
    }
};

class MetaspaceDecoder final : public Decoder {
public:
    MetaspaceDecoder(std::string replacement, bool prepend)
        : replacement_(std::move(replacement)), prepend_(prepend) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t i = 0; i < tokens.size(); ++i) {
            std::string out;
            const std::string& t = tokens[i];
            size_t p = 0;
            while (p < t.size()) {
                if (t.compare(p, replacement_.size(), replacement_) == 0) {
                    if (!(i == 0 && prepend_)) out.push_back(' ');
                    p += replacement_.size();
                } else {
                    out.push_back(t[p]);
                    ++p;
                }
            }
            tokens[i] = std::move(out);
        }
    }

private:
    std::string replacement_;
    bool prepend_;
};

class ReplaceDecoder final : public Decoder {
public:
    ReplaceDecoder(Regex regex, std::string content)
        : regex_(std::move(regex)), content_(std::move(content)) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (std::string& t : tokens) {
            if (t.empty()) continue;  // HF: an empty token has one empty non-match
            std::string out;
            size_t prev = 0;
            regex_.find_iter(t, [&](size_t b, size_t e) {
                out.append(t, prev, b - prev);
                out += content_;
                prev = e;
            });
            out.append(t, prev, std::string::npos);
            t = std::move(out);
        }
    }

private:
    Regex regex_;
    std::string content_;
};

// "<0xHH>" -> the byte, as Rust's u8::from_str_radix(&token[3..5], 16) reads it.
bool parse_byte_token(const std::string& t, uint8_t* out) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    const int hi = t[3] == '+' ? 0 : hex(t[3]);  // from_str_radix accepts a leading '+'
    const int lo = hex(t[4]);
    if (hi < 0 || lo < 0) return false;
    *out = static_cast<uint8_t>(hi * 16 + lo);
    return true;
}

class ByteFallbackDecoder final : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::vector<std::string> out;
        std::string pending;
        auto flush = [&] {
            if (pending.empty()) return;
            if (utf8::is_valid(pending)) {
                out.push_back(pending);
            } else {
                for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
            }
            pending.clear();
        };
        for (std::string& t : tokens) {
            uint8_t b;
            if (parse_byte_token(t, &b)) {
                pending.push_back(static_cast<char>(b));
            } else {
                flush();
                out.push_back(std::move(t));
            }
        }
        flush();
        tokens.swap(out);
    }
};

class FuseDecoder final : public Decoder {
public:
    void decode_chain(std::vector<std::string>& tokens) const override {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
    }
};

class StripDecoder final : public Decoder {
public:
    StripDecoder(char32_t content, size_t start, size_t stop)
        : content_(content), start_(start), stop_(stop) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (std::string& t : tokens) {
            std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, char)
            size_t i = 0;
            while (i < t.size()) {
                int len;
                chars.emplace_back(i, utf8::decode(t, i, &len));
                i += static_cast<size_t>(len);
            }
            size_t start_cut = 0;
            for (size_t k = 0; k < start_ && k < chars.size(); ++k) {
                if (chars[k].second != content_) break;
                start_cut = k + 1;
            }
            size_t stop_cut = chars.size();
            for (size_t k = 0; k < stop_ && k < chars.size(); ++k) {
                const size_t index = chars.size() - k - 1;
                if (chars[index].second != content_) break;
                stop_cut = index;
            }
            if (stop_cut < start_cut) stop_cut = start_cut;
            const size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
            const size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
            t = t.substr(b, e - b);
        }
    }

private:
    char32_t content_;
    size_t start_, stop_;
};

// Replaces every occurrence of `from` (non-empty) in s by `to`.
std::string replace_all(const std::string& s, std::string_view from, std::string_view to) {
    if (from.empty()) return s;
    std::string out;
    size_t p = 0;
    while (true) {
        const size_t q = s.find(from, p);
        if (q == std::string::npos) break;
        out.append(s, p, q - p);
        out += to;
        p = q + from.size();
    }
    out.append(s, p, std::string::npos);
    return out;
}

class BpeDecoder final : public Decoder {
public:
    explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t i = 0; i < tokens.size(); ++i) {
            tokens[i] = replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
        }
    }

private:
    std::string suffix_;
};

std::string wordpiece_cleanup(std::string s) {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules) s = replace_all(s, from, to);
    return s;
}

class WordPieceDecoder final : public Decoder {
public:
    WordPieceDecoder(std::string prefix, bool cleanup)
        : prefix_(std::move(prefix)), cleanup_(cleanup) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (size_t i = 0; i < tokens.size(); ++i) {
            std::string& t = tokens[i];
            if (i != 0) {
                if (t.starts_with(prefix_)) {
                    t = t.substr(prefix_.size());
                } else {
                    t = " " + t;
                }
            }
            if (cleanup_) t = wordpiece_cleanup(std::move(t));
        }
    }

private:
    std::string prefix_;
    bool cleanup_;
};

class SequenceDecoder final : public Decoder {
public:
    explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
        : steps_(std::move(steps)) {}
    void decode_chain(std::vector<std::string>& tokens) const override {
        for (const auto& s : steps_) s->decode_chain(tokens);
    }

private:
    std::vector<std::unique_ptr<Decoder>> steps_;
};

const std::vector<std::string>& decoder_type_names() {
    static const std::vector<std::string> names = {"ByteLevel",    "Metaspace", "Replace",
                                                   "ByteFallback", "Fuse",      "Strip",
                                                   "BPEDecoder",   "WordPiece", "Sequence"};
    return names;
}

Result<char32_t> one_char(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view s, node.as_string());
    if (s.empty() || utf8::count_chars(s) != 1) {
        return node.error(
            fmt::format("expected a single character, got '{}'", escape_for_message(s)));
    }
    int len;
    return utf8::decode(s, 0, &len);
}

}  // namespace

Result<std::unique_ptr<Decoder>> decoder_from_node(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view type, component_type(node));
    using P = std::unique_ptr<Decoder>;
    if (type == "ByteLevel") return P(new ByteLevelDecoder());
    if (type == "ByteFallback") return P(new ByteFallbackDecoder());
    if (type == "Fuse") return P(new FuseDecoder());
    if (type == "Metaspace") {
        char32_t replacement = 0x2581;
        if (std::optional<JsonNode> r = node.field("replacement"); r && !r->is_null()) {
            LATHE_ASSIGN_OR_RETURN(replacement, one_char(*r));
        }
        bool prepend = true;
        LATHE_ASSIGN_OR_RETURN(std::string_view scheme,
                               node.get_string("prepend_scheme", "always"));
        if (scheme == "never") {
            prepend = false;
        } else if (scheme != "always" && scheme != "first") {
            return node.error(fmt::format("unknown prepend_scheme '{}'", scheme));
        }
        if (std::optional<JsonNode> a = node.field("add_prefix_space"); a && !a->is_null()) {
            LATHE_ASSIGN_OR_RETURN(bool add, a->as_bool());
            if (!add) prepend = false;
        }
        return P(new MetaspaceDecoder(utf8::encode(replacement), prepend));
    }
    if (type == "Replace") {
        LATHE_ASSIGN_OR_RETURN(JsonNode pattern, node.required("pattern"));
        LATHE_ASSIGN_OR_RETURN(Regex regex, regex_from_pattern_node(pattern));
        LATHE_ASSIGN_OR_RETURN(JsonNode content_node, node.required("content"));
        LATHE_ASSIGN_OR_RETURN(std::string_view content, content_node.as_string());
        return P(new ReplaceDecoder(std::move(regex), std::string(content)));
    }
    if (type == "Strip") {
        LATHE_ASSIGN_OR_RETURN(JsonNode content_node, node.required("content"));
        LATHE_ASSIGN_OR_RETURN(char32_t content, one_char(content_node));
        LATHE_ASSIGN_OR_RETURN(int64_t start, node.get_int("start", 0));
        LATHE_ASSIGN_OR_RETURN(int64_t stop, node.get_int("stop", 0));
        if (start < 0 || stop < 0) return node.error("start and stop must be >= 0");
        return P(new StripDecoder(content, static_cast<size_t>(start), static_cast<size_t>(stop)));
    }
    if (type == "BPEDecoder") {
        LATHE_ASSIGN_OR_RETURN(std::string_view suffix, node.get_string("suffix", "</w>"));
        return P(new BpeDecoder(std::string(suffix)));
    }
    if (type == "WordPiece") {
        LATHE_ASSIGN_OR_RETURN(std::string_view prefix, node.get_string("prefix", "##"));
        LATHE_ASSIGN_OR_RETURN(bool cleanup, node.get_bool("cleanup", true));
        return P(new WordPieceDecoder(std::string(prefix), cleanup));
    }
    if (type == "Sequence") {
        LATHE_ASSIGN_OR_RETURN(JsonNode list, node.required("decoders"));
        LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, list.as_array());
        std::vector<P> steps;
        for (const JsonNode& item : items) {
            LATHE_ASSIGN_OR_RETURN(P step, decoder_from_node(item));
            steps.push_back(std::move(step));
        }
        return P(new SequenceDecoder(std::move(steps)));
    }
    if (type == "CTC") {
        return Status(StatusCode::kUnimplemented,
                      fmt::format("{}: {}: decoder type 'CTC' is not supported by lathe",
                                  node.source(), node.path()));
    }
    return node.error(fmt::format("unknown decoder type '{}'{}; supported: {}", type,
                                  did_you_mean(type, decoder_type_names()),
                                  fmt::join(decoder_type_names(), ", ")));
}

}  // namespace lathe
