#pragma once
// Reading tokenizer.json (internal to src/tokenizer): a simdjson DOM element together with its
// JSON path and the file it came from, so that every error names both
// ("gpt2.json: pre_tokenizer.pretokenizers[1].behavior: expected a string, got number").
// Nodes borrow the parser's memory: they must not outlive the simdjson::dom::parser.

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe {

class JsonNode {
public:
    JsonNode(simdjson::dom::element element, std::string path, const std::string* source)
        : element_(element), path_(std::move(path)), source_(source) {}

    const std::string& path() const { return path_; }
    const std::string& source() const { return *source_; }
    simdjson::dom::element element() const { return element_; }

    bool is_null() const { return element_.is_null(); }
    bool is_object() const { return element_.is_object(); }
    bool is_array() const { return element_.is_array(); }
    bool is_string() const { return element_.is_string(); }
    // "object", "array", "string", "number", "bool" or "null".
    const char* type_name() const;

    // The member `key` of an object node, or nullopt when absent (an error when this node is not
    // an object is reported by require/field callers through `expect_object`).
    std::optional<JsonNode> field(std::string_view key) const;
    // The member `key`, which must be present and not null.
    Result<JsonNode> required(std::string_view key) const;

    Status expect_object() const;
    Result<std::string_view> as_string() const;
    Result<bool> as_bool() const;
    Result<int64_t> as_int() const;
    Result<std::vector<JsonNode>> as_array() const;
    // Object members in document order.
    Result<std::vector<std::pair<std::string_view, JsonNode>>> as_object() const;

    // Optional typed members: absent or null gives `fallback`; a wrong type is an error.
    Result<bool> get_bool(std::string_view key, bool fallback) const;
    Result<int64_t> get_int(std::string_view key, int64_t fallback) const;
    Result<std::string_view> get_string(std::string_view key, std::string_view fallback) const;
    // Present string or nullopt (absent/null).
    Result<std::optional<std::string_view>> get_optional_string(std::string_view key) const;

    // "<source>: <path>: <message>" as an invalid-argument Status.
    Status error(std::string_view message) const;

private:
    simdjson::dom::element element_;
    std::string path_;
    const std::string* source_;
};

// Parses `json_text` with `parser` and returns its root node (path `root_path`). Errors name the
// source and simdjson's reason.
Result<JsonNode> json_parse_root(simdjson::dom::parser& parser, std::string_view json_text,
                                 const std::string* source, std::string root_path);

}  // namespace lathe
