#pragma once
// Supervised fine-tuning records in the layouts LLaMA-Factory datasets use, mapped onto chat
// messages ([{"role", "content"}, ...]) that a model's chat template renders (`lathe prepare
// --format alpaca|sharegpt`, data/prepare.h; docs/SFT.md).
//
// alpaca: {"instruction", "input" (optional), "output", "system" (optional), "history"
// (optional)} becomes
//   [system]            when "system" is a non-empty string
//   user, assistant     for each [prompt, response] pair of "history", in order
//   user                "instruction" + "\n" + "input"; either part alone when the other is empty
//   assistant           "output"
//
// sharegpt: {"conversations": [{"from": tag, "value": text}, ...], "system" (optional)}. Each
// tag maps to a role (SharegptTags: human/user -> user, gpt/assistant -> assistant, system ->
// system, observation -> tool, function_call -> assistant). A leading system turn becomes the
// system message (else a non-empty "system" string field does); the turns after it alternate
// user-side (user, observation) and assistant-side (assistant, function_call) tags, starting on
// the user side and ending on the assistant side, as LLaMA-Factory's converter requires.
//
// Every record that cannot make a trainable conversation is an error with a RecordProblem (for
// the per-reason counts of `--on-error skip`) and a message naming the field: a missing or
// mistyped field, an unknown tag, a turn out of order or a conversation with no final assistant
// turn, an empty user or assistant text. An empty "system" (field or turn) adds no system message.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

// Why a record makes no document (the `--on-error skip` counts are kept per problem).
enum class RecordProblem {
    kNotJson,       // the record does not parse as JSON
    kMissingField,  // a required field is absent
    kWrongType,     // a field holds the wrong JSON type
    kUnknownRole,   // a sharegpt tag that maps to no role
    kRoleOrder,     // turns out of order, or no final assistant turn
    kEmpty,         // an empty conversation, message or document
    kTooLong,       // more tokens than the sequence length
    kTemplate,      // the chat template failed to render it
    kText,          // a plain-text document problem (invalid UTF-8, tokenizer)
};

// "not JSON", "missing field", "wrong type", "unknown role", "role order", "empty", "too long",
// "template", "text".
const char* record_problem_name(RecordProblem problem);

// How sharegpt turns name their speaker: the keys of a turn and the tags of each role. Defaults
// are LLaMA-Factory's sharegpt defaults plus the OpenAI role names ("user", "assistant").
struct SharegptTags {
    std::string role_key = "from";
    std::string content_key = "value";
    std::vector<std::string> user = {"human", "user"};
    std::vector<std::string> assistant = {"gpt", "assistant"};
    std::vector<std::string> system = {"system"};
    std::vector<std::string> observation = {"observation"};  // -> role "tool"
    std::vector<std::string> function = {"function_call"};   // -> role "assistant"
};

// Applies a `--role-tags` value to `tags`: comma-separated KEY=VALUE items, where KEY is one of
// role_tag, content_tag (the turn's keys) or user_tag, assistant_tag, system_tag,
// observation_tag, function_tag (LLaMA-Factory's dataset_info.json names). A role's VALUE lists
// its tags separated by '|' and replaces the defaults of that role. Errors name the bad item.
Status sharegpt_tags_parse(std::string_view spec, SharegptTags& tags);

// The messages of an alpaca record. On error, `problem` says why.
Status alpaca_to_messages(const nlohmann::ordered_json& record, nlohmann::ordered_json& messages,
                          RecordProblem& problem);

// The messages of a sharegpt record whose turns are in `key` (default "conversations").
Status sharegpt_to_messages(const nlohmann::ordered_json& record, const std::string& key,
                            const SharegptTags& tags, nlohmann::ordered_json& messages,
                            RecordProblem& problem);

}  // namespace lathe
