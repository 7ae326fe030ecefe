#pragma once
// Normalizers: the "normalizer" field of a Hugging Face tokenizer.json.
//
// A normalizer rewrites a whole piece of text (the text between two added tokens) before it is
// pre-tokenized, exactly as HF `tokenizers` does (NormalizedString). lathe only needs the ids, so
// normalizers produce the normalized text without HF's per-character alignments; the one fact the
// rest of the pipeline needs from the alignments (whether the text still starts at the first
// character of the original, used by Metaspace's prepend_scheme "first") is returned by
// normalize().
//
// Supported "type"s (fields as HF serializes them; missing optional fields take HF's defaults):
//   NFC, NFD, NFKC, NFKD         Unicode normalization forms (utf8proc)
//   Lowercase                    per-character full lowercase mapping (Rust's char::to_lowercase)
//   Strip {left, right}          removes leading/trailing White_Space characters
//   StripAccents                 removes combining marks (general category M*)
//   Replace {pattern: {String|Regex}, content}
//                                every non-overlapping match replaced by content
//   Prepend {prepend}            prefix added to non-empty text
//   BertNormalizer {clean_text, handle_chinese_chars, strip_accents, lowercase}
//   ByteLevel                    each byte shown as its GPT-2 printable stand-in
//   Nmt                          SentencePiece's nmt_nfkc control-character clean-up (without NFKC)
//   Sequence {normalizers}       each in turn
// Precompiled (SentencePiece charsmap) is not supported: loading it is an Unimplemented error.
//
// Unicode versions. HF takes the data of NFC/NFD/NFKC/NFKD and StripAccents from Unicode 9.0
// tables; lathe reproduces that on top of utf8proc (Unicode 15) by treating the characters added
// since 9.0 as HF does (checked over every code point against HF). Two known differences remain,
// both only for characters assigned after Unicode 9.0: Lowercase follows utf8proc's Unicode 15
// case mappings where HF's Rust follows Unicode 16, and BertNormalizer's character categories
// in HF come from tables older than Unicode 9.0.
//
// Thread safety: a constructed Normalizer is immutable; normalize() may run on many threads.

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

class Normalizer {
public:
    virtual ~Normalizer() = default;

    // Appends the normalized form of `text` to `out` (which it does not clear). `text` must be
    // valid UTF-8 (the caller validated it); the output is valid UTF-8. Returns true when the
    // output still starts at the original first character (HF: the first normalized character's
    // alignment starts at 0), false when leading characters were dropped (Strip of leading
    // spaces, a Replace of a leading match by "", ...). An empty input returns true.
    // Errors: a Replace pattern that gives up on `text` (it backtracks too far; the message names
    // the pattern and says what to do); `out` then holds a part of the output.
    virtual Result<bool> normalize(std::string_view text, std::string& out) const = 0;

    // Convenience for tests and tools: the normalized text as a new string (errors as normalize).
    Result<std::string> normalize_to_string(std::string_view text) const;
};

// Builds a normalizer from the JSON text of one "normalizer" node (an object with "type"), as
// found in tokenizer.json. `source_name` names where the JSON came from, for error messages.
// Errors: malformed JSON, a missing or wrongly typed field, an unknown or unsupported type, an
// invalid regex; each message names the JSON path (e.g. "normalizer.normalizers[1].pattern").
// A JSON `null` is an error here: callers treat a null "normalizer" as "no normalizer".
Result<std::unique_ptr<Normalizer>> normalizer_from_json(std::string_view json_text,
                                                         const std::string& source_name);

}  // namespace lathe
