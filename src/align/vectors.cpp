#include "align/vectors.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "core/check.h"
#include "core/strings.h"
#include "io/file.h"

namespace lathe {
namespace {

bool is_blank(char c) {
    return c == ' ' || c == '\t' || c == '\r';
}

// Splits one line into fields on runs of blanks (fastText ends each row with a space; files made
// on Windows carry '\r').
void split_fields(std::string_view line, std::vector<std::string_view>& out) {
    out.clear();
    size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && is_blank(line[i])) ++i;
        const size_t start = i;
        while (i < line.size() && !is_blank(line[i])) ++i;
        if (i > start) out.push_back(line.substr(start, i - start));
    }
}

template <typename T>
std::optional<T> parse_integer(std::string_view s) {
    T value{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
    return value;
}

bool all_digits(std::string_view s) {
    if (s.empty()) return false;
    for (char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

}  // namespace

std::vector<int64_t> TokenVectors::rows_by_id(int64_t vocab_size) const {
    std::vector<int64_t> rows(size_t(std::max<int64_t>(vocab_size, 0)), -1);
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] >= 0 && ids[i] < vocab_size) rows[size_t(ids[i])] = int64_t(i);
    return rows;
}

Status vectors_write_text(const std::string& path, const TokenVectors& vectors) {
    LATHE_CHECK(vectors.dim > 0, "dim={}", vectors.dim);
    LATHE_CHECK(vectors.values.size() == vectors.ids.size() * size_t(vectors.dim),
                "values={} ids={} dim={}", vectors.values.size(), vectors.ids.size(), vectors.dim);
    LATHE_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
    fmt::memory_buffer line;
    for (size_t i = 0; i < vectors.ids.size(); ++i) {
        line.clear();
        fmt::format_to(std::back_inserter(line), "{}", vectors.ids[i]);
        const float* v = vectors.values.data() + i * size_t(vectors.dim);
        // "{}" is fmt's shortest representation that reads back to the same float.
        for (int64_t d = 0; d < vectors.dim; ++d)
            fmt::format_to(std::back_inserter(line), " {}", v[d]);
        line.push_back('\n');
        LATHE_RETURN_IF_ERROR(file.write(line.data(), line.size()));
    }
    return file.commit();
}

Result<TokenVectors> vectors_read_text(const std::string& path) {
    LATHE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
    const std::string_view text = file.view();
    TokenVectors out;
    std::unordered_set<int32_t> seen;
    std::vector<std::string_view> fields;
    std::optional<int64_t> header_rows;
    size_t pos = 0;
    int64_t line_no = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string_view::npos) end = text.size();
        const std::string_view line = text.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        split_fields(line, fields);
        if (fields.empty()) continue;
        // A word2vec/fastText header: exactly two integers on the first line.
        if (line_no == 1 && fields.size() == 2 && all_digits(fields[0]) && all_digits(fields[1])) {
            const auto n = parse_integer<int64_t>(fields[0]);
            const auto d = parse_integer<int64_t>(fields[1]);
            if (!n || !d || *d <= 0)
                return data_loss_error("{}:1: header '{}' is not 'rows dimensions'", path,
                                       escape_for_message(line));
            header_rows = *n;
            out.dim = *d;
            continue;
        }
        const int64_t values = int64_t(fields.size()) - 1;
        if (values <= 0)
            return data_loss_error("{}:{}: a row needs a token id and at least one value, got '{}'",
                                   path, line_no, escape_for_message(line));
        if (out.dim == 0) out.dim = values;
        if (values != out.dim)
            return data_loss_error(
                "{}:{}: {} values, but the {} has {}: every row must have the same dimension", path,
                line_no, values, header_rows ? "header" : "first row", out.dim);
        if (!all_digits(fields[0])) {
            // GloVe's "<unk>" and fastText's "</s>" stand for no token id.
            out.skipped.emplace_back(fields[0]);
            continue;
        }
        const auto id = parse_integer<int32_t>(fields[0]);
        if (!id)
            return data_loss_error("{}:{}: token id '{}' does not fit a 32-bit integer", path,
                                   line_no, escape_for_message(fields[0]));
        if (!seen.insert(*id).second)
            return data_loss_error("{}:{}: token id {} appears a second time", path, line_no, *id);
        out.ids.push_back(*id);
        for (int64_t d = 1; d <= values; ++d) {
            const std::string_view f = fields[size_t(d)];
            float v = 0;
            // from_chars does not take a leading '+'; Python's "%f" and C's "%lf" never write one.
            const auto [p, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
            if (ec != std::errc() || p != f.data() + f.size() || !std::isfinite(v))
                return data_loss_error("{}:{}: value {} of token {} is '{}', not a finite number",
                                       path, line_no, d, *id, escape_for_message(f));
            out.values.push_back(v);
        }
    }
    if (out.ids.empty())
        return data_loss_error("{}: no token vectors (an empty file, or only rows like <unk>)",
                               path);
    if (header_rows && *header_rows != out.size() + int64_t(out.skipped.size()))
        return data_loss_error("{}:1: the header says {} rows, the file has {}", path, *header_rows,
                               out.size() + int64_t(out.skipped.size()));
    return out;
}

}  // namespace lathe
