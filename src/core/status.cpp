#include "core/status.h"

namespace lathe {

const char* status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk:
            return "ok";
        case StatusCode::kInvalidArgument:
            return "invalid argument";
        case StatusCode::kNotFound:
            return "not found";
        case StatusCode::kIoError:
            return "i/o error";
        case StatusCode::kDataLoss:
            return "corrupt data";
        case StatusCode::kFailedPrecondition:
            return "failed precondition";
        case StatusCode::kUnimplemented:
            return "unsupported";
        case StatusCode::kCancelled:
            return "cancelled";
        case StatusCode::kInternal:
            return "internal error";
    }
    return "unknown";
}

std::string Status::to_string() const {
    if (ok()) return "ok";
    return fmt::format("{}: {}", status_code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
    if (ok()) return *this;
    return Status(code_, fmt::format("{}: {}", context, message_));
}

}  // namespace lathe
