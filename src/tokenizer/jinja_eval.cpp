// The interpreter of the jinja engine: walks the syntax tree with jinja2's scoping (each loop
// iteration and macro call is a fresh scope; if-blocks are not scopes), Python operator
// semantics and jinja2's Undefined behaviour.

#include <cmath>
#include <limits>

#include "tokenizer/jinja.h"
#include "tokenizer/jinja_internal.h"

namespace lathe::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

// A scope: variables set in it, and the enclosing scope to read through.
struct Frame {
    Frame* parent = nullptr;
    std::vector<std::pair<std::string, Value>> vars;

    // Binds the names jinja2 starts as undefined in this scope (see Stmt::scope_undefined).
    void hide(const std::vector<std::string>& names) {
        for (const std::string& n : names) set(n, Value::undefined(n));
    }

    const Value* find(std::string_view name) const {
        for (const Frame* f = this; f; f = f->parent)
            for (auto it = f->vars.rbegin(); it != f->vars.rend(); ++it)
                if (it->first == name) return &it->second;
        return nullptr;
    }
    void set(const std::string& name, Value v) {
        for (auto& [k, old] : vars) {
            if (k == name) {
                old = std::move(v);
                return;
            }
        }
        vars.emplace_back(name, std::move(v));
    }
};

// `loop` inside a for loop.
class LoopObject : public Object {
public:
    LoopObject(std::shared_ptr<const std::vector<Value>> items, size_t index)
        : items_(std::move(items)), index_(index) {}
    const char* type_name() const override { return "LoopContext"; }
    std::string repr() const override {
        return "<LoopContext " + std::to_string(index_ + 1) + "/" + std::to_string(items_->size()) +
               ">";
    }
    Value get_attr(std::string_view name) const override {
        const int64_t n = int64_t(items_->size());
        const int64_t i = int64_t(index_);
        if (name == "index") return Value::integer(i + 1);
        if (name == "index0") return Value::integer(i);
        if (name == "revindex") return Value::integer(n - i);
        if (name == "revindex0") return Value::integer(n - i - 1);
        if (name == "first") return Value::boolean(i == 0);
        if (name == "last") return Value::boolean(i == n - 1);
        if (name == "length") return Value::integer(n);
        if (name == "depth") return Value::integer(1);
        if (name == "depth0") return Value::integer(0);
        if (name == "previtem")
            return i > 0 ? (*items_)[size_t(i - 1)] : Value::undefined("there is no previous item");
        if (name == "nextitem")
            return i + 1 < n ? (*items_)[size_t(i + 1)] : Value::undefined("there is no next item");
        if (name == "cycle") {
            const size_t idx = index_;
            return Value::object(std::make_shared<Function>("cycle", [idx](Args& a) {
                if (a.positional.empty()) throw_error("no items for cycling given");
                return a.positional[idx % a.positional.size()];
            }));
        }
        return Object::get_attr(name);
    }

private:
    std::shared_ptr<const std::vector<Value>> items_;
    size_t index_;
};

int64_t checked(__int128 v) {
    if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min())
        throw_error("integer overflow: lathe's template integers are 64-bit");
    return int64_t(v);
}

[[noreturn]] void bad_operands(const char* op, const Value& l, const Value& r) {
    throw_error(std::string("unsupported operand type(s) for ") + op + ": '" + l.type_name() +
                "' and '" + r.type_name() + "'");
}

Value repeat(const Value& seq, int64_t n) {
    // Python would try (and run out of memory); a template has no business building gigabytes.
    constexpr int64_t kMaxRepeatItems = int64_t(1) << 28;
    const int64_t unit =
        seq.is_string() ? int64_t(seq.as_string().size()) : int64_t(seq.as_list().size());
    if (n > 0 && unit > 0 && n > kMaxRepeatItems / unit) throw_error("repetition result too large");
    if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value::string(std::move(out));
    }
    List out;
    for (int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
    return seq.kind() == Kind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

// CPython's float modulo: the result takes the divisor's sign (a zero too).
double py_fmod(double a, double b) {
    double m = std::fmod(a, b);
    if (m == 0.0) return std::copysign(0.0, b);
    if ((b < 0) != (m < 0)) m += b;
    return m;
}

Value arith(BinOp op, const Value& l, const Value& r) {
    // `str % x` formats even an undefined x (Python treats it as a mapping).
    if (op == BinOp::kMod && l.is_string()) return Value::string(percent_format(l.as_string(), r));
    if (l.is_undefined()) l.fail_undefined();
    if (r.is_undefined()) r.fail_undefined();
    const bool nums = l.is_number() && r.is_number();
    const bool ints = nums && l.kind() != Kind::kFloat && r.kind() != Kind::kFloat;
    switch (op) {
        case BinOp::kAdd:
            if (ints) return Value::integer(checked(__int128(l.as_int()) + r.as_int()));
            if (nums) return Value::floating(l.as_double() + r.as_double());
            if (l.is_string() && r.is_string()) return Value::string(l.as_string() + r.as_string());
            if (l.is_sequence() && l.kind() == r.kind()) {
                List out = l.as_list();
                out.insert(out.end(), r.as_list().begin(), r.as_list().end());
                return l.kind() == Kind::kTuple ? Value::tuple(std::move(out))
                                                : Value::list(std::move(out));
            }
            bad_operands("+", l, r);
        case BinOp::kSub:
            if (ints) return Value::integer(checked(__int128(l.as_int()) - r.as_int()));
            if (nums) return Value::floating(l.as_double() - r.as_double());
            bad_operands("-", l, r);
        case BinOp::kMul:
            if (ints) return Value::integer(checked(__int128(l.as_int()) * r.as_int()));
            if (nums) return Value::floating(l.as_double() * r.as_double());
            if ((l.is_string() || l.is_sequence()) &&
                (r.kind() == Kind::kInt || r.kind() == Kind::kBool))
                return repeat(l, r.as_int());
            if ((r.is_string() || r.is_sequence()) &&
                (l.kind() == Kind::kInt || l.kind() == Kind::kBool))
                return repeat(r, l.as_int());
            bad_operands("*", l, r);
        case BinOp::kDiv:
            if (!nums) bad_operands("/", l, r);
            if (r.as_double() == 0.0) throw_error("division by zero");
            return Value::floating(l.as_double() / r.as_double());
        case BinOp::kFloorDiv:
            if (!nums) bad_operands("//", l, r);
            if (ints) {
                const int64_t a = l.as_int(), b = r.as_int();
                if (b == 0) throw_error("integer division or modulo by zero");
                int64_t q = a / b;
                if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
                return Value::integer(q);
            } else {
                const double a = l.as_double(), b = r.as_double();
                if (b == 0.0) throw_error("float floor division by zero");
                // CPython's float_floor_div.
                const double mod = std::fmod(a, b);
                double div = (a - mod) / b;
                if (mod != 0.0 && ((b < 0) != (mod < 0))) div -= 1.0;
                double fl = std::floor(div);
                if (div - fl > 0.5) fl += 1.0;
                return Value::floating(div == 0.0 ? std::copysign(0.0, a / b) : fl);
            }
        case BinOp::kMod:
            if (l.is_string()) return Value::string(percent_format(l.as_string(), r));
            if (!nums) bad_operands("%", l, r);
            if (ints) {
                const int64_t a = l.as_int(), b = r.as_int();
                if (b == 0) throw_error("integer division or modulo by zero");
                int64_t m = a % b;
                if (m != 0 && ((m < 0) != (b < 0))) m += b;
                return Value::integer(m);
            }
            if (r.as_double() == 0.0) throw_error("float modulo");
            return Value::floating(py_fmod(l.as_double(), r.as_double()));
        case BinOp::kPow:
            if (!nums) bad_operands("** or pow()", l, r);
            if (ints && r.as_int() >= 0) {
                __int128 result = 1;
                const __int128 base = l.as_int();
                for (int64_t i = 0; i < r.as_int(); ++i) {
                    result *= base;
                    checked(result);
                    if (result == 0 || result == 1) break;
                }
                return Value::integer(checked(result));
            }
            if (l.as_double() == 0.0 && r.as_double() < 0)
                throw_error("0.0 cannot be raised to a negative power");
            {
                const double p = std::pow(l.as_double(), r.as_double());
                if (std::isinf(p) && std::isfinite(l.as_double()) && std::isfinite(r.as_double()))
                    throw_error("(34, 'Numerical result out of range')");
                return Value::floating(p);
            }
    }
    throw_error("unknown operator");
}

// Python slicing of strings (by code point), lists and tuples.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
    auto idx = [](const Value& v, const char* what) -> std::optional<int64_t> {
        if (v.is_none() || v.is_undefined()) return std::nullopt;
        if (v.kind() != Kind::kInt && v.kind() != Kind::kBool)
            throw_error(std::string("slice ") + what + " must be an integer or None");
        return v.as_int();
    };
    const std::optional<int64_t> b = idx(start, "start"), e = idx(stop, "stop"),
                                 s = idx(step, "step");
    const int64_t st = s.value_or(1);
    if (st == 0) throw_error("slice step cannot be zero");
    std::u32string chars;
    const List* items = nullptr;
    int64_t n;
    if (obj.is_string()) {
        chars = utf8_decode(obj.as_string());
        n = int64_t(chars.size());
    } else if (obj.is_sequence()) {
        items = &obj.as_list();
        n = int64_t(items->size());
    } else {
        if (obj.is_undefined()) obj.fail_undefined();
        throw_error(std::string("'") + obj.type_name() + "' object is not subscriptable");
    }
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
        if (!v) return dflt;
        int64_t i = *v;
        if (i < 0) {
            i += n;
            if (i < 0) i = st < 0 ? -1 : 0;
        } else if (i >= n) {
            i = st < 0 ? n - 1 : n;
        }
        return i;
    };
    const int64_t lo = clamp(b, st < 0 ? n - 1 : 0);
    const int64_t hi = clamp(e, st < 0 ? -1 : n);
    std::u32string out_chars;
    List out_items;
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
        if (items)
            out_items.push_back((*items)[size_t(i)]);
        else
            out_chars.push_back(chars[size_t(i)]);
    }
    if (!items) return Value::string(utf8_encode(out_chars));
    return obj.kind() == Kind::kTuple ? Value::tuple(std::move(out_items))
                                      : Value::list(std::move(out_items));
}

class Interp {
public:
    Interp(std::string* out, const RenderOptions& options) : out_(out), options_(options) {}

    Flow exec_body(const Body& body, Frame& f) {
        for (const StmtPtr& s : body) {
            const Flow flow = exec(*s, f);
            if (flow != Flow::kNormal) return flow;
        }
        return Flow::kNormal;
    }

    Frame* root = nullptr;

private:
    Flow exec(const Stmt& s, Frame& f) {
        try {
            return exec_inner(s, f);
        } catch (Error& e) {
            if (e.line == 0) e.line = s.line;
            throw;
        }
    }

    std::string capture(const Body& body, Frame& f) {
        std::string buf;
        std::string* saved = out_;
        out_ = &buf;
        try {
            exec_body(body, f);
        } catch (...) {
            out_ = saved;
            throw;
        }
        out_ = saved;
        return buf;
    }

    Value apply_filters(const std::vector<ExprPtr>& filters, Value v, Frame& f) {
        for (const ExprPtr& flt : filters) v = call_filter(*flt, v, f);
        return v;
    }

    void bind(const Stmt& s, const Value& v, Frame& target) {
        if (!s.target_tuple) {
            target.set(s.targets[0], v);
            return;
        }
        std::vector<Value> parts = iterate(v);
        if (parts.size() > s.targets.size())
            throw_error("too many values to unpack (expected " + std::to_string(s.targets.size()) +
                        ")");
        if (parts.size() < s.targets.size())
            throw_error("not enough values to unpack (expected " +
                        std::to_string(s.targets.size()) + ", got " + std::to_string(parts.size()) +
                        ")");
        for (size_t i = 0; i < parts.size(); ++i) target.set(s.targets[i], parts[i]);
    }

    Flow exec_inner(const Stmt& s, Frame& f) {
        switch (s.kind) {
            case StmtKind::kText:
                out_->append(s.text);
                return Flow::kNormal;
            case StmtKind::kPrint:
                eval(*s.expr, f).append_str(*out_);
                return Flow::kNormal;
            case StmtKind::kIf:
                for (const auto& [cond, body] : s.branches)
                    if (eval(*cond, f).truthy()) return exec_body(body, f);
                return exec_body(s.else_body, f);
            case StmtKind::kFor:
                return exec_for(s, f);
            case StmtKind::kSet:
                bind(s, eval(*s.expr, f), f);
                return Flow::kNormal;
            case StmtKind::kSetAttr: {
                const Value* target = f.find(s.targets[0]);
                if (!target || target->kind() != Kind::kObject ||
                    !target->as_object()->set_attr(s.text, eval(*s.expr, f)))
                    throw_error("can't assign attribute '" + s.text + "' on '" + s.targets[0] +
                                "': only namespace() objects take attribute assignment");
                return Flow::kNormal;
            }
            case StmtKind::kSetBlock: {
                Frame scope{&f, {}};
                scope.hide(s.scope_undefined);
                Value v = Value::string(capture(s.body, scope));
                f.set(s.targets[0], apply_filters(s.filters, std::move(v), f));
                return Flow::kNormal;
            }
            case StmtKind::kFilterBlock: {
                Frame scope{&f, {}};
                scope.hide(s.scope_undefined);
                Value v = Value::string(capture(s.body, scope));
                apply_filters(s.filters, std::move(v), f).append_str(*out_);
                return Flow::kNormal;
            }
            case StmtKind::kMacro:
                f.set(s.text, make_macro(s, root));
                return Flow::kNormal;
            case StmtKind::kCallBlock: {
                // The call's macro receives caller=, a callable that renders this block's body.
                const Expr& call = *s.expr;
                const Value callee = eval(*call.a, f);
                Args a = eval_args(call, f);
                a.keyword.emplace_back("caller", make_macro(s, &f));
                call_value(callee, a).append_str(*out_);
                return Flow::kNormal;
            }
            case StmtKind::kWith: {
                Frame scope{&f, {}};
                scope.hide(s.scope_undefined);
                for (size_t i = 0; i < s.targets.size(); ++i)
                    scope.set(s.targets[i], eval(*s.values[i], f));
                return exec_body(s.body, scope);
            }
            case StmtKind::kBreak:
                return Flow::kBreak;
            case StmtKind::kContinue:
                return Flow::kContinue;
            case StmtKind::kGeneration: {
                const size_t begin = out_->size();
                Frame scope{&f, {}};
                scope.hide(s.scope_undefined);
                const Flow flow = exec_body(s.body, scope);
                if (options_.generation_spans && out_ == top_out())
                    options_.generation_spans->emplace_back(begin, out_->size());
                return flow;
            }
        }
        return Flow::kNormal;
    }

    std::string* top_out() const { return top_; }

    Flow exec_for(const Stmt& s, Frame& f) {
        std::vector<Value> items = iterate(eval(*s.expr, f));
        if (s.cond) {
            std::vector<Value> kept;
            for (Value& item : items) {
                Frame scope{&f, {}};
                bind(s, item, scope);
                if (eval(*s.cond, scope).truthy()) kept.push_back(std::move(item));
            }
            items = std::move(kept);
        }
        if (items.empty()) {
            Frame scope{&f, {}};
            scope.hide(s.else_scope_undefined);
            return exec_body(s.else_body, scope);  // break/continue here belong to an outer loop
        }
        auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
        for (size_t i = 0; i < shared->size(); ++i) {
            Frame scope{&f, {}};
            scope.hide(s.scope_undefined);
            bind(s, (*shared)[i], scope);
            scope.set("loop", Value::object(std::make_shared<LoopObject>(shared, i)));
            const Flow flow = exec_body(s.body, scope);
            if (flow == Flow::kBreak) break;
        }
        return Flow::kNormal;
    }

    // A macro (or the body of a {% call %} block, `parent` its defining scope) as a callable,
    // binding arguments as jinja2's Macro.__call__ does.
    Value make_macro(const Stmt& s, Frame* parent) {
        const Stmt* def = &s;
        Interp* self = this;
        const std::string name = s.kind == StmtKind::kMacro ? s.text : "caller";
        return Value::object(std::make_shared<Function>(name, [def, self, parent, name](Args& a) {
            // Python stops runaway recursion with RecursionError; so does this, before the stack.
            if (self->macro_depth_ >= kMaxMacroDepth)
                throw_error("maximum recursion depth exceeded in macro '" + name + "'");
            struct Depth {
                int& d;
                explicit Depth(int& depth) : d(depth) { ++d; }
                ~Depth() { --d; }
            } depth(self->macro_depth_);
            const size_t nparams = def->targets.size();
            Frame scope{parent, {}};
            scope.hide(def->scope_undefined);
            std::vector<std::pair<std::string, Value>> kwargs = a.keyword;
            auto take_kwarg = [&](const std::string& k, Value& out) {
                for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
                    if (it->first != k) continue;
                    out = it->second;
                    kwargs.erase(it);
                    return true;
                }
                return false;
            };
            for (size_t i = 0; i < nparams; ++i) {
                Value v;
                if (i < a.positional.size()) {
                    v = a.positional[i];
                } else if (!take_kwarg(def->targets[i], v)) {
                    if (def->values[i])
                        v = self->eval(*def->values[i], scope);
                    else
                        v = Value::undefined("parameter '" + def->targets[i] +
                                             "' was not provided");
                }
                scope.set(def->targets[i], std::move(v));
            }
            if (def->catch_caller) {
                Value caller;
                if (!take_kwarg("caller", caller)) caller = Value::undefined("No caller defined");
                scope.set("caller", std::move(caller));
            }
            if (def->catch_kwargs) {
                Dict d;
                for (auto& [k, v] : kwargs) d.items.emplace_back(Value::string(k), v);
                scope.set("kwargs", Value::dict(std::move(d)));
            } else if (!kwargs.empty()) {
                if (kwargs[0].first == "caller")
                    throw_error("macro '" + name +
                                "' was invoked with two values for the special caller argument");
                throw_error("macro '" + name + "' takes no keyword argument '" + kwargs[0].first +
                            "'");
            }
            if (def->catch_varargs) {
                List extra;
                for (size_t i = nparams; i < a.positional.size(); ++i)
                    extra.push_back(a.positional[i]);
                scope.set("varargs", Value::tuple(std::move(extra)));
            } else if (a.positional.size() > nparams) {
                throw_error("macro '" + name + "' takes not more than " + std::to_string(nparams) +
                            " argument(s)");
            }
            return Value::string(self->capture(def->body, scope));
        }));
    }

    Args eval_args(const Expr& e, Frame& f) {
        Args a;
        a.positional.reserve(e.args.size());
        for (const ExprPtr& x : e.args) a.positional.push_back(eval(*x, f));
        for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x, f));
        if (e.c) {  // *args
            for (Value& v : iterate(eval(*e.c, f))) a.positional.push_back(std::move(v));
        }
        if (e.d) {  // **kwargs
            const Value d = eval(*e.d, f);
            if (d.kind() != Kind::kDict)
                throw_error(std::string("argument after ** must be a mapping, not ") +
                            d.type_name());
            for (const auto& [k, v] : d.as_dict().items) {
                if (!k.is_string()) throw_error("keywords must be strings");
                a.keyword.emplace_back(k.as_string(), v);
            }
        }
        return a;
    }

    Value call_filter(const Expr& e, const Value& input, Frame& f) {
        if (!e.filter) throw_error("no filter named '" + e.name + "'");
        Args a = eval_args(e, f);
        return e.filter(input, a);
    }

public:
    Value eval(const Expr& e, Frame& f) {
        try {
            return eval_inner(e, f);
        } catch (Error& err) {
            if (err.line == 0) err.line = e.line;
            throw;
        }
    }

    void set_top(std::string* top) { top_ = top; }

private:
    Value eval_inner(const Expr& e, Frame& f) {
        switch (e.kind) {
            case ExprKind::kConst:
                return e.value;
            case ExprKind::kName: {
                if (const Value* v = f.find(e.name)) return *v;
                return find_global(e.name);
            }
            case ExprKind::kGetattr: {
                const Value obj = eval(*e.a, f);
                if (obj.is_undefined()) obj.fail_undefined();
                return get_attr(obj, e.name);
            }
            case ExprKind::kGetitem: {
                const Value obj = eval(*e.a, f);
                if (obj.is_undefined()) obj.fail_undefined();
                if (e.b->kind == ExprKind::kSlice) {
                    const Expr& sl = *e.b;
                    const Value none = Value::none();
                    return slice(obj, sl.a ? eval(*sl.a, f) : none, sl.b ? eval(*sl.b, f) : none,
                                 sl.c ? eval(*sl.c, f) : none);
                }
                return get_item(obj, eval(*e.b, f));
            }
            case ExprKind::kSlice:
                throw_error("a slice is only valid inside []");
            case ExprKind::kCall: {
                if (e.a->kind == ExprKind::kGetattr) {
                    const Value obj = eval(*e.a->a, f);
                    if (obj.is_undefined()) obj.fail_undefined();
                    Args a = eval_args(e, f);
                    Value out;
                    if (call_method(obj, e.a->name, a, out)) return out;
                    return call_value(get_attr(obj, e.a->name), a);
                }
                const Value callee = eval(*e.a, f);
                Args a = eval_args(e, f);
                return call_value(callee, a);
            }
            case ExprKind::kFilter:
                return call_filter(e, eval(*e.a, f), f);
            case ExprKind::kTest: {
                if (!e.test) throw_error("no test named '" + e.name + "'");
                const Value v = eval(*e.a, f);
                Args a = eval_args(e, f);
                return Value::boolean(e.test(v, a));
            }
            case ExprKind::kNot:
                return Value::boolean(!eval(*e.a, f).truthy());
            case ExprKind::kNeg:
            case ExprKind::kPos: {
                const Value v = eval(*e.a, f);
                if (v.is_undefined()) v.fail_undefined();
                const bool neg = e.kind == ExprKind::kNeg;
                if (v.kind() == Kind::kFloat)
                    return Value::floating(neg ? -v.as_double() : v.as_double());
                if (v.is_number())
                    return Value::integer(neg ? checked(-__int128(v.as_int())) : v.as_int());
                throw_error(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" +
                            v.type_name() + "'");
            }
            case ExprKind::kBinary: {
                const Value l = eval(*e.a, f);
                const Value r = eval(*e.b, f);
                return arith(e.bin_op, l, r);
            }
            case ExprKind::kAnd: {
                Value l = eval(*e.a, f);
                if (!l.truthy()) return l;
                return eval(*e.b, f);
            }
            case ExprKind::kOr: {
                Value l = eval(*e.a, f);
                if (l.truthy()) return l;
                return eval(*e.b, f);
            }
            case ExprKind::kConcat: {
                std::string out;
                for (const ExprPtr& x : e.args) {
                    eval(*x, f).append_str(out);
                    check_string_size(out.size());
                }
                return Value::string(std::move(out));
            }
            case ExprKind::kCompare: {
                Value left = eval(*e.args[0], f);
                for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
                    Value right = eval(*e.args[i + 1], f);
                    bool ok = false;
                    switch (e.cmp_ops[i]) {
                        case CmpOp::kEq:
                            ok = equals(left, right);
                            break;
                        case CmpOp::kNe:
                            ok = !equals(left, right);
                            break;
                        case CmpOp::kLt:
                            ok = less_than(left, right);
                            break;
                        case CmpOp::kLe:
                            ok = less_than(left, right) || equals(left, right);
                            break;
                        case CmpOp::kGt:
                            ok = less_than(right, left);
                            break;
                        case CmpOp::kGe:
                            ok = less_than(right, left) || equals(left, right);
                            break;
                        case CmpOp::kIn:
                            ok = contains(right, left);
                            break;
                        case CmpOp::kNotIn:
                            ok = !contains(right, left);
                            break;
                    }
                    if (!ok) return Value::boolean(false);
                    left = std::move(right);
                }
                return Value::boolean(true);
            }
            case ExprKind::kCond:
                if (eval(*e.a, f).truthy()) return eval(*e.b, f);
                if (e.c) return eval(*e.c, f);
                return Value::undefined("the inline if-expression on line " +
                                        std::to_string(e.line) +
                                        " evaluated to false and no else section was defined.");
            case ExprKind::kList:
            case ExprKind::kTuple: {
                List items;
                items.reserve(e.args.size());
                for (const ExprPtr& x : e.args) items.push_back(eval(*x, f));
                return e.kind == ExprKind::kList ? Value::list(std::move(items))
                                                 : Value::tuple(std::move(items));
            }
            case ExprKind::kDict: {
                Dict d;
                for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
                    Value k = eval(*e.args[i], f);
                    Value v = eval(*e.args[i + 1], f);
                    bool replaced = false;
                    for (auto& [ek, ev] : d.items) {
                        if (equals(ek, k)) {
                            ev = v;
                            replaced = true;
                        }
                    }
                    if (!replaced) d.items.emplace_back(std::move(k), std::move(v));
                }
                return Value::dict(std::move(d));
            }
        }
        throw_error("unknown expression");
    }

    static constexpr int kMaxMacroDepth = 200;
    int macro_depth_ = 0;
    std::string* out_;
    std::string* top_ = nullptr;
    const RenderOptions& options_;
};

}  // namespace

struct Template::Impl {
    std::string name;
    ParsedTemplate parsed;
};

Template::Template(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

const std::string& Template::name() const {
    return impl_->name;
}

Result<Template> Template::parse(std::string_view source, std::string name) {
    auto impl = std::make_unique<Impl>();
    impl->name = std::move(name);
    try {
        impl->parsed = parse_template(source);
    } catch (const Error& e) {
        return invalid_argument_error("template '{}', line {}: syntax error: {}", impl->name,
                                      e.line, e.message);
    }
    return Template(std::move(impl));
}

Result<std::string> Template::render(const std::vector<std::pair<std::string, Value>>& variables,
                                     const RenderOptions& options) const {
    std::string out;
    Interp interp(&out, options);
    interp.set_top(&out);
    Frame root;
    root.vars = variables;
    root.hide(impl_->parsed.root_undefined);
    interp.root = &root;
    set_render_time(options.now);
    try {
        interp.exec_body(impl_->parsed.body, root);
    } catch (const Error& e) {
        set_render_time(std::nullopt);
        if (e.raised)
            return invalid_argument_error("template '{}', line {}: raise_exception: {}",
                                          impl_->name, e.line, e.message);
        return invalid_argument_error("template '{}', line {}: {}", impl_->name, e.line, e.message);
    }
    set_render_time(std::nullopt);
    return out;
}

}  // namespace lathe::jinja
