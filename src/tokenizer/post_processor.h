#pragma once
// Post-processors ("post_processor" of tokenizer.json), reduced to what they do to the ids of a
// single sequence when HF encodes with add_special_tokens=True (internal to src/tokenizer):
//   TemplateProcessing {single, special_tokens}   the "single" template: special token ids around
//                                                 (or between copies of) the sequence $A
//   BertProcessing {cls, sep}, RobertaProcessing  [cls] A [sep]
//   ByteLevel                                     nothing (it only trims offsets)
//   Sequence {processors}                         each in turn, the later wrapping the earlier
// With add_special_tokens=False none of them changes the ids.

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "tokenizer/json_node.h"

namespace lathe {

class PostProcessor {
public:
    // One step: a template of items; an item >= 0 is a special token id, kSequence is the input.
    static constexpr int32_t kSequence = -1;
    using Template = std::vector<int32_t>;

    // Builds from a non-null "post_processor" node; the ids come from the file. Errors (an
    // unknown type, a template naming a special token missing from "special_tokens", $B in the
    // single template) name the JSON path.
    static Result<PostProcessor> from_node(const JsonNode& node);

    // Applies the templates to `ids` (in place). `scratch` is a work buffer.
    void apply(std::vector<int32_t>& ids, std::vector<int32_t>& scratch) const;

    // Number of ids it adds to a single sequence.
    size_t added_count() const;

private:
    Status append_from_node(const JsonNode& node);
    std::vector<Template> steps_;  // applied in order
};

}  // namespace lathe
