#include "data/sft_records.h"

#include <algorithm>

#include "core/strings.h"

namespace lathe {

using Json = nlohmann::ordered_json;

const char* record_problem_name(RecordProblem problem) {
    switch (problem) {
        case RecordProblem::kNotJson:
            return "not JSON";
        case RecordProblem::kMissingField:
            return "missing field";
        case RecordProblem::kWrongType:
            return "wrong type";
        case RecordProblem::kUnknownRole:
            return "unknown role";
        case RecordProblem::kRoleOrder:
            return "role order";
        case RecordProblem::kEmpty:
            return "empty";
        case RecordProblem::kTooLong:
            return "too long";
        case RecordProblem::kTemplate:
            return "template";
        case RecordProblem::kText:
            return "text";
    }
    return "?";
}

namespace {

// "an object", "a string", "null", ... for a JSON value.
std::string kind_of(const Json& v) {
    if (v.is_null()) return "null";
    const std::string name = v.type_name();
    const bool vowel = name[0] == 'a' || name[0] == 'o';
    return (vowel ? "an " : "a ") + name;
}

Status fail(RecordProblem& problem, RecordProblem why, std::string message) {
    problem = why;
    return invalid_argument_error("{}", message);
}

Json message(const char* role, const Json& content) {
    Json m = Json::object();
    m["role"] = role;
    m["content"] = content;
    return m;
}

// The record's optional string field `key`: "" when absent or null; an error for another type.
Status optional_string(const Json& record, const char* key, std::string& out,
                       RecordProblem& problem) {
    out.clear();
    const auto it = record.find(key);
    if (it == record.end() || it->is_null()) return ok_status();
    if (!it->is_string()) {
        return fail(problem, RecordProblem::kWrongType,
                    fmt::format("field \"{}\" is {}, expected a string", key, kind_of(*it)));
    }
    out = it->get<std::string>();
    return ok_status();
}

std::string join_tags(const std::vector<std::string>& tags) {
    std::string s;
    for (const std::string& t : tags) s += (s.empty() ? "" : "|") + t;
    return s;
}

bool has_tag(const std::vector<std::string>& tags, const std::string& tag) {
    return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

}  // namespace

Status sharegpt_tags_parse(std::string_view spec, SharegptTags& tags) {
    std::vector<std::string_view> given;
    for (std::string_view item : split(spec, ',')) {
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
            return invalid_argument_error(
                "--role-tags: '{}' is not KEY=VALUE (e.g. user_tag=human|user,assistant_tag=gpt)",
                item);
        }
        const std::string_view key = item.substr(0, eq);
        if (std::find(given.begin(), given.end(), key) != given.end())
            return invalid_argument_error("--role-tags: {} is given twice; give it once", key);
        given.push_back(key);
        const std::string_view value = item.substr(eq + 1);
        std::vector<std::string> list;
        for (std::string_view v : split(value, '|')) {
            if (!v.empty()) list.emplace_back(v);
        }
        if (list.empty()) return invalid_argument_error("--role-tags: '{}' names no tag", item);
        if (key == "role_tag" || key == "content_tag") {
            if (list.size() != 1) {
                return invalid_argument_error("--role-tags: {} takes one key name, got '{}'", key,
                                              value);
            }
            (key == "role_tag" ? tags.role_key : tags.content_key) = list[0];
        } else if (key == "user_tag") {
            tags.user = list;
        } else if (key == "assistant_tag") {
            tags.assistant = list;
        } else if (key == "system_tag") {
            tags.system = list;
        } else if (key == "observation_tag") {
            tags.observation = list;
        } else if (key == "function_tag") {
            tags.function = list;
        } else {
            return invalid_argument_error(
                "--role-tags: unknown key '{}': expected role_tag, content_tag, user_tag, "
                "assistant_tag, system_tag, observation_tag or function_tag",
                key);
        }
    }
    if (tags.role_key == tags.content_key) {
        return invalid_argument_error(
            "--role-tags: role_tag and content_tag are both '{}'; a message's role and its text "
            "are two keys",
            tags.role_key);
    }
    // One tag naming two roles would make the mapping depend on the order of the checks.
    const std::vector<const std::vector<std::string>*> roles = {
        &tags.user, &tags.assistant, &tags.system, &tags.observation, &tags.function};
    for (size_t a = 0; a < roles.size(); ++a) {
        for (size_t b = a + 1; b < roles.size(); ++b) {
            for (const std::string& t : *roles[a]) {
                if (has_tag(*roles[b], t))
                    return invalid_argument_error("--role-tags: tag '{}' names two roles", t);
            }
        }
    }
    return ok_status();
}

Status alpaca_to_messages(const Json& record, Json& messages, RecordProblem& problem) {
    messages = Json::array();
    std::string system, instruction, input;
    LATHE_RETURN_IF_ERROR(optional_string(record, "system", system, problem));
    LATHE_RETURN_IF_ERROR(optional_string(record, "instruction", instruction, problem));
    LATHE_RETURN_IF_ERROR(optional_string(record, "input", input, problem));
    const auto output = record.find("output");
    if (output == record.end() || output->is_null()) {
        return fail(problem, RecordProblem::kMissingField, "no \"output\" field");
    }
    if (!output->is_string()) {
        return fail(problem, RecordProblem::kWrongType,
                    fmt::format("field \"output\" is {}, expected a string", kind_of(*output)));
    }
    if (!system.empty()) messages.push_back(message("system", system));

    const auto history = record.find("history");
    if (history != record.end() && !history->is_null()) {
        if (!history->is_array()) {
            return fail(problem, RecordProblem::kWrongType,
                        fmt::format("field \"history\" is {}, expected an array of [prompt, "
                                    "response] pairs",
                                    kind_of(*history)));
        }
        for (size_t i = 0; i < history->size(); ++i) {
            const Json& pair = (*history)[i];
            if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() ||
                !pair[1].is_string()) {
                return fail(problem, RecordProblem::kWrongType,
                            fmt::format("history[{}] is not a [prompt, response] pair of strings "
                                        "(it is {}{})",
                                        i, kind_of(pair),
                                        pair.is_array() ? fmt::format(" of {}", pair.size())
                                                        : std::string()));
            }
            if (pair[0].get_ref<const std::string&>().empty() ||
                pair[1].get_ref<const std::string&>().empty()) {
                return fail(
                    problem, RecordProblem::kEmpty,
                    fmt::format(
                        "history[{}] has an empty {}", i,
                        pair[0].get_ref<const std::string&>().empty() ? "prompt" : "response"));
            }
            messages.push_back(message("user", pair[0]));
            messages.push_back(message("assistant", pair[1]));
        }
    }

    if (instruction.empty() && input.empty()) {
        const bool any = record.contains("instruction") || record.contains("input");
        return fail(problem, any ? RecordProblem::kEmpty : RecordProblem::kMissingField,
                    any ? "empty prompt (\"instruction\" and \"input\" are both empty)"
                        : "no \"instruction\" field");
    }
    std::string prompt = instruction;
    if (!instruction.empty() && !input.empty()) prompt += '\n';
    prompt += input;
    messages.push_back(message("user", prompt));
    if (output->get_ref<const std::string&>().empty()) {
        return fail(problem, RecordProblem::kEmpty, "empty \"output\"");
    }
    messages.push_back(message("assistant", *output));
    return ok_status();
}

Status sharegpt_to_messages(const Json& record, const std::string& key, const SharegptTags& tags,
                            Json& messages, RecordProblem& problem) {
    messages = Json::array();
    const auto turns = record.find(key);
    if (turns == record.end() || turns->is_null()) {
        return fail(problem, RecordProblem::kMissingField, fmt::format("no \"{}\" field", key));
    }
    if (!turns->is_array()) {
        return fail(
            problem, RecordProblem::kWrongType,
            fmt::format("field \"{}\" is {}, expected an array of turns", key, kind_of(*turns)));
    }
    if (turns->empty())
        return fail(problem, RecordProblem::kEmpty,
                    fmt::format("empty conversation (\"{}\" is [])", key));

    // Each turn's tag and text, checked.
    struct Turn {
        const std::string* tag;
        const Json* text;
    };
    std::vector<Turn> checked;
    for (size_t i = 0; i < turns->size(); ++i) {
        const Json& t = (*turns)[i];
        if (!t.is_object()) {
            return fail(problem, RecordProblem::kWrongType,
                        fmt::format("{}[{}] is {}, expected an object with \"{}\" and \"{}\"", key,
                                    i, kind_of(t), tags.role_key, tags.content_key));
        }
        const auto role = t.find(tags.role_key);
        const auto text = t.find(tags.content_key);
        for (const auto& [it, name] :
             {std::pair{role, &tags.role_key}, std::pair{text, &tags.content_key}}) {
            if (it == t.end()) {
                return fail(problem, RecordProblem::kMissingField,
                            fmt::format("{}[{}] has no \"{}\" (--role-tags role_tag=, "
                                        "content_tag= name other keys)",
                                        key, i, *name));
            }
            if (!it->is_string()) {
                return fail(
                    problem, RecordProblem::kWrongType,
                    fmt::format("{}[{}].{} is {}, expected a string", key, i, *name, kind_of(*it)));
            }
        }
        checked.push_back({&role->get_ref<const std::string&>(), &*text});
    }

    size_t first = 0;
    std::string system;
    if (has_tag(tags.system, *checked[0].tag)) {
        system = checked[0].text->get<std::string>();
        first = 1;
    } else {
        LATHE_RETURN_IF_ERROR(optional_string(record, "system", system, problem));
    }
    if (!system.empty()) messages.push_back(message("system", system));

    for (size_t i = first; i < checked.size(); ++i) {
        const std::string& tag = *checked[i].tag;
        const bool user_side = (i - first) % 2 == 0;
        const char* role = nullptr;
        bool side_ok = false;
        if (has_tag(tags.user, tag)) {
            role = "user";
            side_ok = user_side;
        } else if (has_tag(tags.observation, tag)) {
            role = "tool";
            side_ok = user_side;
        } else if (has_tag(tags.assistant, tag) || has_tag(tags.function, tag)) {
            role = "assistant";
            side_ok = !user_side;
        } else if (has_tag(tags.system, tag)) {
            return fail(problem, RecordProblem::kRoleOrder,
                        fmt::format("{}[{}]: a \"{}\" turn after the first turn", key, i, tag));
        } else {
            return fail(
                problem, RecordProblem::kUnknownRole,
                fmt::format("{}[{}]: unknown {} \"{}\" (user: {}, assistant: {}, system: "
                            "{}, observation: {}, function: {}; --role-tags maps others)",
                            key, i, tags.role_key, escape_for_message(tag), join_tags(tags.user),
                            join_tags(tags.assistant), join_tags(tags.system),
                            join_tags(tags.observation), join_tags(tags.function)));
        }
        if (!side_ok) {
            return fail(problem, RecordProblem::kRoleOrder,
                        fmt::format("{}[{}]: \"{}\" where {} turn belongs (turns alternate "
                                    "user/observation and assistant/function_call, user first)",
                                    key, i, tag, user_side ? "a user" : "an assistant"));
        }
        if (checked[i].text->get_ref<const std::string&>().empty()) {
            return fail(problem, RecordProblem::kEmpty,
                        fmt::format("{}[{}]: empty \"{}\"", key, i, tags.content_key));
        }
        messages.push_back(message(role, *checked[i].text));
    }
    const size_t n = checked.size() - first;
    if (n == 0) {
        return fail(problem, RecordProblem::kEmpty,
                    fmt::format("{} holds only a system turn", key));
    }
    if (n % 2 != 0) {
        return fail(problem, RecordProblem::kRoleOrder,
                    fmt::format("{} ends with a user-side turn (\"{}\"); the last turn must be an "
                                "assistant's",
                                key, *checked.back().tag));
    }
    return ok_status();
}

}  // namespace lathe
