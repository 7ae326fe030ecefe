#pragma once
// Pre-tokenizers: the "pre_tokenizer" field of a Hugging Face tokenizer.json, and the ByteLevel
// byte <-> unicode mapping.
//
// A pre-tokenizer cuts normalized text into pieces ("words"); the BPE model then encodes each
// piece on its own. Pre-tokenizers may also rewrite the text of a piece (ByteLevel maps every byte
// to a printable character, Metaspace turns spaces into '▁'). lathe reproduces HF `tokenizers`
// piece for piece: same boundaries, same rewritten text, empty pieces dropped.
//
// Supported "type"s (fields as HF serializes them; missing optional fields take HF's defaults):
//   ByteLevel {add_prefix_space, use_regex}   GPT-2's regex split (Isolated), then byte mapping
//   Split {pattern: {String|Regex}, behavior, invert}
//       behavior: Removed | Isolated | MergedWithPrevious | MergedWithNext | Contiguous
//   Metaspace {replacement, prepend_scheme: always|first|never, split}  (legacy add_prefix_space)
//   Digits {individual_digits}, Whitespace, WhitespaceSplit, Punctuation {behavior},
//   BertPreTokenizer, CharDelimiterSplit {delimiter}, Sequence {pretokenizers}
// Regexes follow Oniguruma's syntax as HF uses it; lathe runs them on PCRE2 (UTF + UCP + JIT)
// after translating the classes whose meaning differs (\s, \w, \d, \h; see regex.h).
//
// Usage (also how the BPE trainer counts words exactly as the tokenizer splits them):
//     PieceList pieces, scratch;                 // reuse across calls: no allocation once warm
//     LATHE_RETURN_IF_ERROR(pre_tokenizer.split(normalized_text, pieces, scratch));
//     for (size_t i = 0; i < pieces.size(); ++i) use(pieces.view(i));
//
// Thread safety: a constructed PreTokenizer is immutable; many threads may call it at once, each
// with its own PieceLists.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

// One piece: the byte range [begin, end) of PieceList::text, and whether the piece starts at the
// first character of the original input (HF: its offsets in the original string start at 0; only
// Metaspace with prepend_scheme "first" looks at it). lathe keeps no per-character alignments, so
// it derives this flag: true for the text before the first added token, kept by normalizers that
// do not drop leading characters, and passed to a sub-piece only when it starts at byte 0 of its
// parent. (HF would also give it to a later sub-piece made only of characters that a normalizer
// inserted in front of the first original one; no known tokenizer.json combines those steps.)
struct Piece {
    uint32_t begin = 0;
    uint32_t end = 0;
    bool at_origin = false;
};

// An ordered list of pieces over one text buffer. Cheap to reuse: clear() keeps capacity.
class PieceList {
public:
    void clear() {
        text_.clear();
        pieces_.clear();
    }
    size_t size() const { return pieces_.size(); }
    bool empty() const { return pieces_.empty(); }
    const Piece& piece(size_t i) const { return pieces_[i]; }
    std::string_view view(size_t i) const {
        return std::string_view(text_).substr(pieces_[i].begin, pieces_[i].end - pieces_[i].begin);
    }
    // Appends a copy of `s` as a new piece; an empty `s` adds nothing (HF drops empty splits).
    void add(std::string_view s, bool at_origin) {
        if (s.empty()) return;
        const auto begin = static_cast<uint32_t>(text_.size());
        text_.append(s);
        pieces_.push_back(Piece{begin, static_cast<uint32_t>(text_.size()), at_origin});
    }
    // For pre-tokenizers that build a piece's text in place: append bytes to text(), then call
    // close_piece(begin) with the size text() had before. An empty piece is dropped.
    std::string& text() { return text_; }
    const std::string& text() const { return text_; }
    void close_piece(size_t begin, bool at_origin) {
        if (text_.size() == begin) return;
        pieces_.push_back(
            Piece{static_cast<uint32_t>(begin), static_cast<uint32_t>(text_.size()), at_origin});
    }
    void swap(PieceList& other) noexcept {
        text_.swap(other.text_);
        pieces_.swap(other.pieces_);
    }

private:
    std::string text_;
    std::vector<Piece> pieces_;
};

class PreTokenizer {
public:
    virtual ~PreTokenizer() = default;

    // Replaces every piece of `pieces` by its sub-pieces, in order (HF's pre_tokenize applied to
    // each split). `scratch` is a work buffer whose contents are undefined afterwards. Piece texts
    // must be valid UTF-8. A Split or ByteLevel pattern that gives up on a piece throws
    // RegexLimitExceeded (internal to src/tokenizer, regex.h); callers elsewhere use split().
    virtual void pre_tokenize(PieceList& pieces, PieceList& scratch) const = 0;

    // Fills `pieces` (cleared first) with the pieces of one normalized text, which HF treats as
    // starting at the original's first character when `at_origin` is true (the usual case).
    // Errors: a pattern that gives up on the text (it backtracks too far; the message names the
    // pattern and says what to do); `pieces` is then cleared.
    Status split(std::string_view normalized_text, PieceList& pieces, PieceList& scratch,
                 bool at_origin = true) const;

    // Convenience for tests and tools (allocates): the pieces as strings (errors as split).
    Result<std::vector<std::string>> split_to_strings(std::string_view normalized_text) const;
};

// Builds a pre-tokenizer from the JSON text of one "pre_tokenizer" node (an object with "type").
// `source_name` names where the JSON came from, for error messages. Errors: malformed JSON, a
// missing or wrongly typed field, an unknown type or behavior, an invalid regex; each message names
// the JSON path (e.g. "pre_tokenizer.pretokenizers[0].pattern.Regex"). A JSON `null` is an error
// here: callers treat a null "pre_tokenizer" as "no pre-tokenizer" (the whole text is one piece).
Result<std::unique_ptr<PreTokenizer>> pre_tokenizer_from_json(std::string_view json_text,
                                                              const std::string& source_name);

// ---- ByteLevel's byte <-> unicode mapping (GPT-2's bytes_to_unicode) ----
// Printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves (as Unicode code points
// of the same value); the 68 others map, in byte order, to U+0100, U+0101, ... (so ' ' is 'Ġ',
// U+0120, and '\n' is 'Ċ', U+010A).

// The code point that stands for `byte`.
char32_t byte_level_char(uint8_t byte);
// The UTF-8 encoding of byte_level_char(byte) (1 or 2 bytes; static storage, never dangles).
std::string_view byte_level_symbol(uint8_t byte);
// The byte a code point stands for, or nullopt when `cp` is not one of the 256 symbols.
std::optional<uint8_t> byte_level_byte(char32_t cp);
// Appends the byte-level form of `bytes` (any bytes) to `out`.
void byte_level_encode(std::string_view bytes, std::string& out);
// Appends the bytes that the byte-level text `symbols` stands for to `out`. Returns false (and
// appends nothing) when `symbols` is not valid UTF-8 or holds a character outside the alphabet.
bool byte_level_decode(std::string_view symbols, std::string& out);

}  // namespace lathe
