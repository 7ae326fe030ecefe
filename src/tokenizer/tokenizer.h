#pragma once
// A Hugging Face tokenizer.json (model type BPE), byte-exact with the `tokenizers` library.
// (Interface fixed first so data/ and cli/ can be written against it; see tokenizer.cpp.)

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

class Tokenizer {
public:
    // Loads tokenizer.json from a path / from its text. Unsupported components are an error that
    // names the component and the JSON path; a file of another kind (empty, a directory, JSON
    // Lines, YAML, a tokenizer_config.json...) is an error that names the file, says what it
    // holds and what was expected.
    static Result<Tokenizer> load(const std::string& path);
    static Result<Tokenizer> from_json(std::string_view json_text, const std::string& source_name);

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // Encodes UTF-8 text as HF's `Tokenizer.encode(text, add_special_tokens=add_special).ids`.
    // Invalid UTF-8 is an error, and so is a normalizer or pre-tokenizer pattern that gives up
    // on the text (it backtracks too far). Safe to call from many threads at once.
    Status encode(std::string_view text, bool add_special, std::vector<int32_t>& ids) const;
    Result<std::vector<int32_t>> encode(std::string_view text, bool add_special) const;

    // Decodes as HF's `Tokenizer.decode(ids, skip_special_tokens=skip_special)`. An id outside
    // the vocabulary is an error; so is a decoder Replace pattern that gives up on the text (it
    // backtracks too far; the message names this tokenizer's source).
    Result<std::string> decode(std::span<const int32_t> ids, bool skip_special) const;

    // The largest id + 1 (the number of embedding rows the ids need; HF's
    // get_vocab_size(with_added_tokens=True) when the ids have no gaps). Up to 2^31, as ids run
    // up to 2^31 - 1.
    int64_t vocab_size() const;
    std::optional<int32_t> token_to_id(std::string_view token) const;
    std::optional<std::string> id_to_token(int32_t id) const;
    bool is_special(int32_t id) const;

private:
    struct Impl;
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace lathe
