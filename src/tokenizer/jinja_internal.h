#pragma once
// Pieces shared by the jinja engine's parser, interpreter and builtins (not a public interface).

#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace lathe::jinja {

// Parses a whole template. Throws Error (with line) on syntax errors.
ParsedTemplate parse_template(std::string_view source);

// Builtin filters and tests by name; nullptr when jinja2 has none of that name.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// Builtin global functions (range, namespace, dict, raise_exception, strftime_now, ...); an
// undefined Value when there is none of that name.
Value find_global(std::string_view name);

// The time strftime_now() formats during the current render (set by the interpreter).
void set_render_time(const std::optional<std::tm>& now);

// jinja2's sandboxed attribute lookup `obj.name`: Python attributes first (methods of str, list,
// dict; unsafe mutating methods give an undefined that fails when called), then items.
Value get_attr(const Value& obj, std::string_view name);
// jinja2's subscript `obj[key]`: items first, then attributes. Missing items are undefined.
Value get_item(const Value& obj, const Value& key);
// Calls `obj.name(args)` when obj is a str/list/tuple/dict and `name` is one of its methods;
// returns false (leaving `out` alone) when it is not.
bool call_method(const Value& obj, std::string_view name, Args& args, Value& out);
// Calls a callable value (function, macro, bound method); throws for anything else.
Value call_value(const Value& callee, Args& args);
// The items a `for` loop visits: list/tuple items, dict keys, string characters; consumes
// generators (as Python does); undefined gives nothing; other values throw "not iterable".
std::vector<Value> iterate(const Value& v);
// Python len(); throws for values without a length (numbers, generators).
int64_t length_of(const Value& v);
// Python's printf-style `fmt % args` (args: a tuple, a dict for %(name)s, or one value).
std::string percent_format(const std::string& fmt, const Value& args);
// `a in b` with Python semantics.
bool contains(const Value& container, const Value& item);

// A one-shot iterator over precomputed items: what jinja2's map/select/reverse/... return
// (generators: always truthy, no len(), exhausted after one pass).
class Generator : public Object {
public:
    Generator(std::string type, std::vector<Value> items)
        : type_(std::move(type)), items_(std::move(items)) {}
    const char* type_name() const override { return type_.c_str(); }
    std::string repr() const override { return "<" + type_ + " object>"; }
    // Takes the remaining items (the generator is exhausted afterwards).
    std::vector<Value> take_all();
    // Takes the next item; false when exhausted.
    bool take_one(Value& out);

private:
    std::string type_;
    std::vector<Value> items_;
    size_t pos_ = 0;
};
Value make_generator(std::string type, std::vector<Value> items);

}  // namespace lathe::jinja
