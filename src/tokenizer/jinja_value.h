#pragma once
// Values of the Jinja engine, with the semantics of the Python objects jinja2 evaluates: truth,
// equality and ordering, `str()` and `repr()` text, arithmetic, and JSON (`json.dumps`) output.
//
// A Value is small and cheap to copy: scalars inline, strings and containers behind shared
// pointers. Lists, tuples and dicts are immutable once built (the chat-template sandbox is
// jinja2's ImmutableSandboxedEnvironment, which forbids mutating them); only a namespace()
// object changes, through `{% set ns.attr = ... %}`.
//
// Runtime errors inside the engine are thrown as jinja::Error and caught at the Template boundary
// (jinja.h), which returns them as a Status; nothing throws out of this module.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lathe::jinja {

using Json = nlohmann::ordered_json;

// A template runtime or syntax error; `line` is 0 when unknown (filled in by the caller).
// `raised` marks the template's own raise_exception(message).
struct Error {
    std::string message;
    int line = 0;
    bool raised = false;
};
[[noreturn]] void throw_error(std::string message);

// The longest string a template may build (256 MiB): past it an error, not gigabytes of memory
// (Python would build them; a chat template has no business to). Value::string checks every
// string made (strings of the input, from_json's, are the input's size and pass as they are);
// code that would allocate a larger one first checks the size it asks for.
inline constexpr size_t kMaxStringBytes = size_t(1) << 28;
void check_string_size(uint64_t bytes);

enum class Kind {
    kUndefined,  // jinja2's default Undefined: falsy, prints as "", fails when used further
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kObject,  // namespace(), callables, loop objects (see Object)
};

class Value;
class Object;
using List = std::vector<Value>;
// An insertion-ordered dict (Python 3.7+ semantics). Small in practice: linear lookup.
struct Dict {
    std::vector<std::pair<Value, Value>> items;
    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
};

class Value {
public:
    Value() = default;  // undefined
    static Value undefined(std::string hint = {});
    static Value none();
    static Value boolean(bool b);
    static Value integer(int64_t i);
    static Value floating(double f);
    static Value string(std::string s);
    static Value list(List items);
    static Value tuple(List items);
    static Value dict(Dict d);
    static Value object(std::shared_ptr<Object> o);
    // JSON as Python's json.loads gives it: null/bool/int/float/str/list/dict, key order kept.
    static Value from_json(const Json& j);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::kUndefined; }
    bool is_none() const { return kind_ == Kind::kNone; }
    bool is_string() const { return kind_ == Kind::kString; }
    bool is_number() const {
        return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
    }
    bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

    // Payload accessors: valid only for the matching kind (checked by the caller via kind()).
    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == Kind::kBool ? int64_t(b_) : i_; }
    double as_double() const;  // int, bool or float
    const std::string& as_string() const { return *str_; }
    const List& as_list() const { return *list_; }
    const Dict& as_dict() const { return *dict_; }
    Object* as_object() const { return obj_.get(); }
    // For undefined values: what was undefined, for error messages ("'x' is undefined").
    const std::string& undefined_hint() const;
    // Throws the error jinja2 raises when an undefined value is used (attribute, call, math).
    [[noreturn]] void fail_undefined() const;

    // Python truth value (undefined is false).
    bool truthy() const;
    // Python str(): what `{{ value }}` prints. Undefined prints as "".
    std::string str() const;
    // Python repr() (strings quoted as Python quotes them).
    std::string repr() const;
    void append_str(std::string& out) const;
    void append_repr(std::string& out) const;
    // Python type name for error messages ("str", "int", "dict", ...).
    const char* type_name() const;

private:
    // A string from the input (from_json), not built by the template: its size is the input's.
    static Value input_string(std::string s);

    Kind kind_ = Kind::kUndefined;
    bool b_ = false;
    int64_t i_ = 0;
    double f_ = 0.0;
    std::shared_ptr<const std::string> str_;  // string, or the undefined hint
    std::shared_ptr<const List> list_;        // list and tuple
    std::shared_ptr<const Dict> dict_;
    std::shared_ptr<Object> obj_;
};

// Python ==, and ordering (<) which throws TypeError-like errors for unorderable types.
bool equals(const Value& a, const Value& b);
bool less_than(const Value& a, const Value& b);

// Arguments of a call: positional then keyword.
struct Args {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keyword;
    // The keyword `name`, else positional[index] if present, else nullptr.
    const Value* get(size_t index, std::string_view name) const;
    // Throws if more positional arguments than `max_positional` or an unknown keyword is given.
    void check(std::string_view function, size_t max_positional,
               std::initializer_list<std::string_view> keywords) const;
};

// Namespaces, callables and other objects that are not plain data.
class Object {
public:
    virtual ~Object() = default;
    virtual const char* type_name() const = 0;
    // Attribute access (`obj.name`); undefined when there is none.
    virtual Value get_attr(std::string_view name) const;
    // Assignment `{% set obj.name = v %}`: only namespaces allow it.
    virtual bool set_attr(std::string_view name, Value v);
    virtual bool callable() const { return false; }
    virtual Value call(Args& args);
    virtual std::string repr() const;
};

// namespace(...): a mutable attribute bag.
class Namespace : public Object {
public:
    Dict attrs;
    const char* type_name() const override { return "Namespace"; }
    Value get_attr(std::string_view name) const override;
    bool set_attr(std::string_view name, Value v) override;
    std::string repr() const override;
};

// A native function (globals such as range(), bound methods, macros).
class Function : public Object {
public:
    using Fn = std::function<Value(Args&)>;
    Function(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
    const char* type_name() const override { return "function"; }
    bool callable() const override { return true; }
    Value call(Args& args) override { return fn_(args); }
    std::string repr() const override { return "<function " + name_ + ">"; }

private:
    std::string name_;
    Fn fn_;
};

// Python float repr ("1.0", "0.1", "1e+20", "inf").
std::string float_repr(double f);
// json.dumps(value, ensure_ascii=False, indent=indent, separators=..., sort_keys=...).
// indent < 0 means None; indent_str, when non-empty, is a string indent (Python allows both).
struct JsonDumpOptions {
    int indent = -1;
    std::string indent_str;
    bool has_indent = false;
    std::string item_separator;  // empty: Python's default for the indent mode
    std::string key_separator;
    bool has_separators = false;
    bool sort_keys = false;
    bool ensure_ascii = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

// --- UTF-8 text as Python sees it (code points) -------------------------------------------
// Decodes to code points; the engine only holds valid UTF-8 (inputs are validated).
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t utf8_length(std::string_view s);
// Python str.isspace() for one code point.
bool py_isspace(char32_t c);
// Python str.upper()/lower()/title()/capitalize(), with Unicode's full case mappings.
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);
// Python str.strip(chars) / lstrip / rstrip; `chars` null: whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace lathe::jinja
