#pragma once
// Status and Result<T>: how expected failures travel (STYLE.md, "Errors").
//
// A Status is either ok or carries a code and a message written for the user: it names the file,
// line or key, what was expected, and what to do. Library code returns these; only cli/ turns one
// into a message and an exit code. Broken invariants are not Statuses: they stop at once through
// LATHE_CHECK (core/check.h).

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace lathe {

enum class StatusCode {
    kOk = 0,
    kInvalidArgument,     // bad input: a flag, a config key, a malformed record
    kNotFound,            // a file, a key, a token that does not exist
    kIoError,             // the OS refused a read or write
    kDataLoss,            // a file exists but is corrupt or truncated
    kFailedPrecondition,  // the request is valid but the state does not allow it
    kUnimplemented,       // a valid request lathe does not support (yet)
    kCancelled,           // stopped by a signal or the user
    kInternal,            // a library below us failed in a way the user cannot fix
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status ok_status() { return Status(); }
    bool ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }
    // "invalid argument: <message>"
    std::string to_string() const;

    // Returns a copy whose message is "<context>: <message>" (for adding a file name or a stage).
    Status with_context(std::string_view context) const;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status ok_status() {
    return Status();
}

template <typename... Args>
Status invalid_argument_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status not_found_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status io_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kIoError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status data_loss_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status failed_precondition_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status unimplemented_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kUnimplemented, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status cancelled_error(fmt::format_string<Args...> f, Args&&... args) {
    return Status(StatusCode::kCancelled, fmt::format(f, std::forward<Args>(args)...));
}

// Result<T>: a T, or the Status that explains why there is none. Constructing from an ok Status
// is a programming error (checked).
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
    Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
        if (status_.ok()) status_ = internal_error("Result constructed from an ok Status");
    }

    bool ok() const { return value_.has_value(); }
    const Status& status() const { return status_; }

    T& value() & { return *value_; }
    const T& value() const& { return *value_; }
    T&& value() && { return std::move(*value_); }
    T& operator*() & { return *value_; }
    const T& operator*() const& { return *value_; }
    T* operator->() { return &*value_; }
    const T* operator->() const { return &*value_; }

private:
    std::optional<T> value_;
    Status status_;
};

}  // namespace lathe

#define LATHE_CONCAT_INNER_(a, b) a##b
#define LATHE_CONCAT_(a, b) LATHE_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function if it is not ok.
#define LATHE_RETURN_IF_ERROR(expr)                    \
    do {                                               \
        ::lathe::Status lathe_status_ = (expr);        \
        if (!lathe_status_.ok()) return lathe_status_; \
    } while (0)

// `LATHE_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define LATHE_ASSIGN_OR_RETURN(lhs, expr) \
    LATHE_ASSIGN_OR_RETURN_IMPL_(LATHE_CONCAT_(lathe_result_, __LINE__), lhs, expr)
#define LATHE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                               \
    if (!tmp.ok()) return tmp.status();              \
    lhs = std::move(tmp).value()
