#pragma once
// The syntax tree of a parsed Jinja template (internal to the jinja engine).
// One node type for expressions and one for statements, each with the fields its kinds use;
// the parser (jinja_parse.cpp) builds them and the interpreter (jinja_eval.cpp) walks them.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace lathe::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
    kConst,    // value
    kName,     // name
    kGetattr,  // a.name
    kGetitem,  // a[b]
    kSlice,    // a[b:c:d] (missing parts are null)
    kCall,     // a(args..., kwargs..., *c, **d)
    kFilter,   // a | name(args..., kwargs..., *c, **d); `a` is null in {% filter %} / {% set %}
               // blocks
    kTest,     // a is name(args..., kwargs..., *c, **d)
    kNot,      // not a
    kNeg,      // -a
    kPos,      // +a
    kBinary,   // a op b (arithmetic)
    kAnd,      // a and b
    kOr,       // a or b
    kConcat,   // args[0] ~ args[1] ~ ...
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ... (chained, as in Python)
    kCond,     // b if a else c (c may be null: undefined)
    kList,     // [args...]
    kTuple,    // (args...)
    kDict,     // {args[0]: args[1], args[2]: args[3], ...}
};

enum class BinOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

using FilterFn = Value (*)(const Value& input, Args& args);
using TestFn = bool (*)(const Value& input, Args& args);

struct Expr {
    ExprKind kind;
    int line = 0;
    Value value;         // kConst
    std::string name;    // kName, kGetattr, kFilter, kTest
    ExprPtr a, b, c, d;  // operands (see ExprKind)
    std::vector<ExprPtr> args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    BinOp bin_op = BinOp::kAdd;
    std::vector<CmpOp> cmp_ops;
    FilterFn filter = nullptr;  // resolved at parse time (unknown names are syntax errors)
    TestFn test = nullptr;
};

enum class StmtKind {
    kText,         // text
    kPrint,        // {{ expr }}
    kIf,           // branches (condition, body), else_body
    kFor,          // targets in expr [if cond] body [else else_body]
    kSet,          // targets = expr      (several targets: tuple unpacking)
    kSetAttr,      // targets[0].attr = expr   (namespace attribute)
    kSetBlock,     // {% set targets[0] | filters %}body{% endset %}
    kMacro,        // {% macro name(params=defaults) %}body{% endmacro %}
    kFilterBlock,  // {% filter filters %}body{% endfilter %}
    kWith,         // {% with targets = values %}body{% endwith %}
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}body{% endgeneration %}
    kCallBlock,   // {% call(targets=values) expr %}body{% endcall %}: expr is a kCall that gets
                  // caller=
};

struct Stmt {
    StmtKind kind;
    int line = 0;
    std::string text;  // kText; the attribute of kSetAttr; kMacro's name
    ExprPtr expr;      // kPrint, kFor (iterable), kSet/kSetAttr (value)
    ExprPtr cond;      // kFor's inline `if`
    std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
    Body body, else_body;
    std::vector<std::string> targets;  // kFor, kSet, kSetAttr, kSetBlock, kWith; kMacro params
    bool target_tuple = false;         // `for a, in ...` / `set a, b = ...`
    std::vector<ExprPtr> values;       // kWith values, kMacro defaults (aligned right, may be null)
    std::vector<ExprPtr> filters;      // kSetBlock, kFilterBlock: kFilter nodes with a == null
    // kMacro / kCallBlock: whether the body reads `caller`, `varargs`, `kwargs` (jinja2 then
    // accepts a caller, extra positional and extra keyword arguments).
    bool catch_caller = false, catch_varargs = false, catch_kwargs = false;
    // Names the scope this statement opens (for body, macro body, block bodies) binds to
    // undefined on entry, and the same for a for loop's else body: jinja2 resolves names at
    // compile time, and a name first assigned unconditionally in a scope hides outer values
    // there until the assignment runs (see analyze_scopes in jinja_parse.cpp).
    std::vector<std::string> scope_undefined, else_scope_undefined;
};

// A parsed template: its statements and the names its top level binds to undefined on entry.
struct ParsedTemplate {
    Body body;
    std::vector<std::string> root_undefined;
};

}  // namespace lathe::jinja
