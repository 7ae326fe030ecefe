#include "tokenizer/post_processor.h"

#include <fmt/format.h>

#include <map>
#include <string>

#include "core/strings.h"
#include "tokenizer/components.h"

namespace lathe {

namespace {

// [cls_or_sep_name, id] as Bert/RobertaProcessing serialize it.
Result<int32_t> token_pair_id(const JsonNode& parent, std::string_view key) {
    LATHE_ASSIGN_OR_RETURN(JsonNode pair, parent.required(key));
    LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, pair.as_array());
    if (items.size() != 2) return pair.error("expected [token, id]");
    LATHE_ASSIGN_OR_RETURN(int64_t id, items[1].as_int());
    if (id < 0 || id > INT32_MAX) return items[1].error("id out of range");
    return static_cast<int32_t>(id);
}

}  // namespace

Result<PostProcessor> PostProcessor::from_node(const JsonNode& node) {
    PostProcessor p;
    LATHE_RETURN_IF_ERROR(p.append_from_node(node));
    return p;
}

Status PostProcessor::append_from_node(const JsonNode& node) {
    LATHE_ASSIGN_OR_RETURN(std::string_view type, component_type(node));
    if (type == "ByteLevel") return ok_status();
    if (type == "Sequence") {
        LATHE_ASSIGN_OR_RETURN(JsonNode list, node.required("processors"));
        LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, list.as_array());
        for (const JsonNode& item : items) LATHE_RETURN_IF_ERROR(append_from_node(item));
        return ok_status();
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
        LATHE_ASSIGN_OR_RETURN(int32_t cls, token_pair_id(node, "cls"));
        LATHE_ASSIGN_OR_RETURN(int32_t sep, token_pair_id(node, "sep"));
        steps_.push_back(Template{cls, kSequence, sep});
        return ok_status();
    }
    if (type == "TemplateProcessing") {
        // special_tokens: {name: {"id": name, "ids": [...], "tokens": [...]}}
        std::map<std::string, std::vector<int32_t>, std::less<>> specials;
        if (std::optional<JsonNode> st = node.field("special_tokens"); st && !st->is_null()) {
            LATHE_ASSIGN_OR_RETURN(auto members, st->as_object());
            for (const auto& [name, value] : members) {
                LATHE_ASSIGN_OR_RETURN(JsonNode ids_node, value.required("ids"));
                LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> ids, ids_node.as_array());
                std::vector<int32_t> v;
                for (const JsonNode& id_node : ids) {
                    LATHE_ASSIGN_OR_RETURN(int64_t id, id_node.as_int());
                    if (id < 0 || id > INT32_MAX) return id_node.error("id out of range");
                    v.push_back(static_cast<int32_t>(id));
                }
                specials[std::string(name)] = std::move(v);
            }
        }
        LATHE_ASSIGN_OR_RETURN(JsonNode single, node.required("single"));
        Template t;
        auto add_special = [&](std::string_view name, const JsonNode& where) -> Status {
            auto it = specials.find(name);
            if (it == specials.end()) {
                return where.error(fmt::format("special token '{}' is not in special_tokens",
                                               escape_for_message(name)));
            }
            t.insert(t.end(), it->second.begin(), it->second.end());
            return ok_status();
        };
        auto add_sequence = [&](std::string_view id, const JsonNode& where) -> Status {
            if (id != "A") {
                return where.error(
                    fmt::format("the single template may only use sequence A, not '{}'", id));
            }
            t.push_back(kSequence);
            return ok_status();
        };
        if (single.is_string()) {
            // "[CLS]:0 $A:0 [SEP]:0" form.
            LATHE_ASSIGN_OR_RETURN(std::string_view text, single.as_string());
            for (std::string_view item : split(text, ' ')) {
                if (item.empty()) continue;
                const std::string_view name = item.substr(
                    0, item.rfind(':') == std::string_view::npos ? item.size() : item.rfind(':'));
                if (name.starts_with("$")) {
                    const std::string_view seq = name.substr(1);
                    LATHE_RETURN_IF_ERROR(add_sequence(
                        seq.empty() || seq == "A" || (seq[0] >= '0' && seq[0] <= '9') ? "A" : seq,
                        single));
                } else {
                    LATHE_RETURN_IF_ERROR(add_special(name, single));
                }
            }
        } else {
            LATHE_ASSIGN_OR_RETURN(std::vector<JsonNode> items, single.as_array());
            for (const JsonNode& item : items) {
                if (std::optional<JsonNode> sp = item.field("SpecialToken")) {
                    LATHE_ASSIGN_OR_RETURN(JsonNode id_node, sp->required("id"));
                    LATHE_ASSIGN_OR_RETURN(std::string_view name, id_node.as_string());
                    LATHE_RETURN_IF_ERROR(add_special(name, id_node));
                } else if (std::optional<JsonNode> sq = item.field("Sequence")) {
                    LATHE_ASSIGN_OR_RETURN(JsonNode id_node, sq->required("id"));
                    LATHE_ASSIGN_OR_RETURN(std::string_view id, id_node.as_string());
                    LATHE_RETURN_IF_ERROR(add_sequence(id, id_node));
                } else {
                    return item.error("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
                }
            }
        }
        steps_.push_back(std::move(t));
        return ok_status();
    }
    static const std::vector<std::string> names = {"TemplateProcessing", "BertProcessing",
                                                   "RobertaProcessing", "ByteLevel", "Sequence"};
    return node.error(fmt::format("unknown post-processor type '{}'{}; supported: {}", type,
                                  did_you_mean(type, names), fmt::join(names, ", ")));
}

void PostProcessor::apply(std::vector<int32_t>& ids, std::vector<int32_t>& scratch) const {
    for (const Template& t : steps_) {
        scratch.clear();
        for (int32_t item : t) {
            if (item == kSequence) {
                scratch.insert(scratch.end(), ids.begin(), ids.end());
            } else {
                scratch.push_back(item);
            }
        }
        ids.swap(scratch);
    }
}

size_t PostProcessor::added_count() const {
    size_t n = 0;
    for (const Template& t : steps_) {
        for (int32_t item : t) n += item != kSequence;
    }
    return n;
}

}  // namespace lathe
