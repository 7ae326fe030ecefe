#pragma once
// JSONL records: one JSON object per line, one string field of it taken as a document's text.
//
// Every line is checked as a whole JSON document (simdjson On-Demand, every value visited), not
// only the field that is used, so a damaged line is reported where it is rather than passing
// silently. Keys are compared after unescaping ("t\u0065xt" is "text"); when a key appears twice
// the last value wins, as in Python's json.loads that GPT-NeoX's reader uses.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe {

// Extracts one string field from JSONL lines. Not thread-safe: one per worker thread.
class JsonlFieldReader {
public:
    explicit JsonlFieldReader(std::string key);
    JsonlFieldReader(JsonlFieldReader&&) noexcept;
    JsonlFieldReader& operator=(JsonlFieldReader&&) noexcept;
    ~JsonlFieldReader();

    // The unescaped value of the field in `line`, valid until the next call. Errors
    // (kInvalidArgument; the message names the problem but not the file and line, which the
    // caller adds): an empty line; a line that is not valid JSON (with the byte column); invalid
    // UTF-8 (with the byte column); a top-level value that is not an object; no such field (the
    // object's first keys are listed); a field that is not a string (its JSON type is named); a
    // string with an invalid escape or an unpaired surrogate escape.
    Result<std::string_view> extract(std::string_view line);

    // True when `line` is a JSON object that has `key` (no other checks); for format detection.
    bool has_field(std::string_view line, std::string_view key);

    const std::string& key() const { return key_; }

private:
    struct Impl;
    std::string key_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace lathe
