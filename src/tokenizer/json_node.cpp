#include "tokenizer/json_node.h"

#include <fmt/format.h>

namespace lathe {

const char* JsonNode::type_name() const {
    switch (element_.type()) {
        case simdjson::dom::element_type::ARRAY:
            return "array";
        case simdjson::dom::element_type::OBJECT:
            return "object";
        case simdjson::dom::element_type::STRING:
            return "string";
        case simdjson::dom::element_type::BOOL:
            return "bool";
        case simdjson::dom::element_type::NULL_VALUE:
            return "null";
        default:
            return "number";
    }
}

Status JsonNode::error(std::string_view message) const {
    return invalid_argument_error("{}: {}: {}", *source_, path_.empty() ? "(root)" : path_,
                                  message);
}

Status JsonNode::expect_object() const {
    if (!is_object()) return error(fmt::format("expected an object, got {}", type_name()));
    return ok_status();
}

std::optional<JsonNode> JsonNode::field(std::string_view key) const {
    if (!is_object()) return std::nullopt;
    simdjson::dom::element child;
    if (element_.get_object().at_key(key).get(child) != simdjson::SUCCESS) return std::nullopt;
    return JsonNode(child, path_.empty() ? std::string(key) : path_ + "." + std::string(key),
                    source_);
}

Result<JsonNode> JsonNode::required(std::string_view key) const {
    LATHE_RETURN_IF_ERROR(expect_object());
    std::optional<JsonNode> child = field(key);
    if (!child || child->is_null()) {
        return error(fmt::format("missing required field '{}'", key));
    }
    return *child;
}

Result<std::string_view> JsonNode::as_string() const {
    std::string_view s;
    if (element_.get_string().get(s) != simdjson::SUCCESS) {
        return error(fmt::format("expected a string, got {}", type_name()));
    }
    return s;
}

Result<bool> JsonNode::as_bool() const {
    bool b = false;
    if (element_.get_bool().get(b) != simdjson::SUCCESS) {
        return error(fmt::format("expected true or false, got {}", type_name()));
    }
    return b;
}

Result<int64_t> JsonNode::as_int() const {
    int64_t v = 0;
    if (element_.get_int64().get(v) == simdjson::SUCCESS) return v;
    uint64_t u = 0;
    if (element_.get_uint64().get(u) == simdjson::SUCCESS) {
        return error(fmt::format("integer {} is too large", u));
    }
    return error(fmt::format("expected an integer, got {}", type_name()));
}

Result<std::vector<JsonNode>> JsonNode::as_array() const {
    simdjson::dom::array arr;
    if (element_.get_array().get(arr) != simdjson::SUCCESS) {
        return error(fmt::format("expected an array, got {}", type_name()));
    }
    std::vector<JsonNode> out;
    out.reserve(arr.size());
    size_t i = 0;
    for (simdjson::dom::element e : arr) {
        out.emplace_back(e, fmt::format("{}[{}]", path_, i), source_);
        ++i;
    }
    return out;
}

Result<std::vector<std::pair<std::string_view, JsonNode>>> JsonNode::as_object() const {
    simdjson::dom::object obj;
    if (element_.get_object().get(obj) != simdjson::SUCCESS) {
        return error(fmt::format("expected an object, got {}", type_name()));
    }
    std::vector<std::pair<std::string_view, JsonNode>> out;
    out.reserve(obj.size());
    for (auto [key, value] : obj) {
        out.emplace_back(key, JsonNode(value, path_ + "." + std::string(key), source_));
    }
    return out;
}

Result<bool> JsonNode::get_bool(std::string_view key, bool fallback) const {
    std::optional<JsonNode> child = field(key);
    if (!child || child->is_null()) return fallback;
    return child->as_bool();
}

Result<int64_t> JsonNode::get_int(std::string_view key, int64_t fallback) const {
    std::optional<JsonNode> child = field(key);
    if (!child || child->is_null()) return fallback;
    return child->as_int();
}

Result<std::string_view> JsonNode::get_string(std::string_view key,
                                              std::string_view fallback) const {
    std::optional<JsonNode> child = field(key);
    if (!child || child->is_null()) return fallback;
    return child->as_string();
}

Result<std::optional<std::string_view>> JsonNode::get_optional_string(std::string_view key) const {
    std::optional<JsonNode> child = field(key);
    if (!child || child->is_null()) return std::optional<std::string_view>();
    LATHE_ASSIGN_OR_RETURN(std::string_view s, child->as_string());
    return std::optional<std::string_view>(s);
}

Result<JsonNode> json_parse_root(simdjson::dom::parser& parser, std::string_view json_text,
                                 const std::string* source, std::string root_path) {
    simdjson::dom::element root;
    const auto err = parser.parse(json_text.data(), json_text.size(), true).get(root);
    if (err != simdjson::SUCCESS) {
        return invalid_argument_error("{}: not valid JSON: {}", *source,
                                      simdjson::error_message(err));
    }
    return JsonNode(root, std::move(root_path), source);
}

}  // namespace lathe
