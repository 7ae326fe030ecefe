#pragma once
// A Jinja template engine with the semantics of Python jinja2 3.1 in the environment Hugging Face
// transformers renders chat templates with: ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols, generation tag]), default Undefined,
// keep_trailing_newline=False, HF's tojson filter and raise_exception / strftime_now globals.
//
// Covered: {{ }} / {% %} / {# #}, whitespace control (-, +), raw blocks; if/elif/else, for
// (tuple targets, inline `if`, else, loop.*, break/continue), set (names, tuples, namespace
// attributes, block set with filters), macro, filter blocks, with, generation; the expression
// language with Python semantics (literals, arithmetic, comparisons, `in`, `and/or/not`, ternary,
// subscripts, slices, attributes, calls); the filters, tests, globals and str/list/dict methods
// that chat templates use (see jinja_builtins.cpp for the list). Template inheritance, includes,
// imports and {% call %} are syntax errors (chat templates are single strings).
//
// Errors: a syntax error from parse(), and a runtime error from render() (raise_exception(),
// undefined values used where jinja2 raises, type errors, sandbox violations), both as a Status
// whose message names the template and line.

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/jinja_value.h"

namespace lathe::jinja {

struct RenderOptions {
    // The local time strftime_now() formats; the current time when unset.
    std::optional<std::tm> now;
    // When set, receives the [begin, end) byte ranges of the output that {% generation %} blocks
    // produced (transformers' assistant-token tracking).
    std::vector<std::pair<size_t, size_t>>* generation_spans = nullptr;
};

class Template {
public:
    // Parses `source`; `name` names the template in error messages. Parsing resolves filters and
    // tests, so an unknown filter is an error here (inside if-blocks and inline ifs, as in
    // jinja2, only when it runs).
    static Result<Template> parse(std::string_view source, std::string name);

    // Renders with the given top-level variables (e.g. messages, bos_token). Safe to call from
    // several threads at once.
    Result<std::string> render(const std::vector<std::pair<std::string, Value>>& variables,
                               const RenderOptions& options = {}) const;

    const std::string& name() const;

    Template(Template&&) noexcept;
    Template& operator=(Template&&) noexcept;
    ~Template();

private:
    struct Impl;
    explicit Template(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace lathe::jinja
