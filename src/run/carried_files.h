#pragma once
// Carried files: what a model folder lathe writes (convert's output, every training checkpoint)
// takes byte for byte from where the model's tokenizer and card sit, besides the weights: the
// tokenizer files (kHfTokenizerFiles, run/special_tokens.h), the chat templates of
// kHfChatTemplateFolder, the model card. They are read once, kept in memory (kilobytes to a few
// megabytes), and written into each folder: a run writes the same bytes into every checkpoint
// however the sources change while it trains.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

struct CarriedFile {
    std::string name;   // relative to the folder, e.g. "additional_chat_templates/tool.jinja"
    std::string bytes;  // the content, as read
};

// The regular files `names` that exist in `folder`, in that order, then the files of its
// kHfChatTemplateFolder sorted by name. Errors: a file that exists but does not read.
Result<std::vector<CarriedFile>> carried_files_read(const std::string& folder,
                                                    std::span<const std::string_view> names);

// The tokenizer files of a checkpoint of a model trained with the tokenizer at `tokenizer_path`
// (a tokenizer.json under any name, e.g. NAME.json): it, as tokenizer.json; the other
// kHfTokenizerFiles and the chat templates beside it; NAME.tokenizer_config.json as
// tokenizer_config.json when no tokenizer_config.json sits there; and without either, a
// tokenizer_config.json made from its special tokens (special_tokens_tokenizer_config with
// `model_max_length`), so that transformers knows its eos/bos tokens. Errors: a file that does
// not read, a tokenizer that does not load (naming the file).
Result<std::vector<CarriedFile>> carried_tokenizer_files(const std::string& tokenizer_path,
                                                         int64_t model_max_length);

// Writes `files` into the existing folder `dir`, each atomically, creating (and syncing) the
// subfolders they name. Errors: kIoError naming the path.
Status carried_files_write(const std::vector<CarriedFile>& files, const std::string& dir);

// The names of `files`, in order (what a result lists as copied).
std::vector<std::string> carried_file_names(const std::vector<CarriedFile>& files);

}  // namespace lathe
