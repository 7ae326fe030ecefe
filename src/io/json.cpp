#include "io/json.h"

#include <algorithm>

#include <fmt/format.h>

namespace lathe {

int64_t json_depth(std::string_view text, int64_t limit) {
    int64_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            deepest = std::max(deepest, ++depth);
            if (deepest > limit) return deepest;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return deepest;
}

std::string json_problem(std::string_view text, int64_t limit) {
    if (json_depth(text, limit) > limit)
        return fmt::format("it nests arrays and objects deeper than {} levels", limit);
    try {
        (void)nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        std::string what = e.what();
        const size_t cut = what.find("] ");  // drop "[json.exception.parse_error.101] "
        return cut == std::string::npos ? what : what.substr(cut + 2);
    }
    return "";
}

}  // namespace lathe
