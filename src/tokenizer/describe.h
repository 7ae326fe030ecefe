#pragma once
// A tokenizer.json described for people (`lathe tokenizer info`): model type, vocabulary and
// merges, model options, each component (normalizer, pre-tokenizer, post-processor, decoder) on
// one line with the settings that change behaviour, the added tokens (the first 20), and whether
// lathe's encoder loads the file (and the vocabulary size it sees).

#include <string>

#include "core/status.h"

namespace lathe {

// The description, one item per line. A file of the wrong kind (a directory, JSON Lines, YAML,
// a config.json...) is an error with the tokenizer loader's message, which says what it holds.
Result<std::string> tokenizer_describe(const std::string& path);

}  // namespace lathe
