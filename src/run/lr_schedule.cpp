#include "run/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace lathe {

Result<LrDecayStyle> lr_decay_style_from_string(const std::string& name) {
    if (name == "constant") return LrDecayStyle::kConstant;
    if (name == "linear") return LrDecayStyle::kLinear;
    if (name == "cosine") return LrDecayStyle::kCosine;
    if (name == "exponential") return LrDecayStyle::kExponential;
    return invalid_argument_error(
        "unknown learning-rate decay style '{}'; choose constant, linear, cosine or exponential",
        name);
}

const char* lr_decay_style_name(LrDecayStyle style) {
    switch (style) {
        case LrDecayStyle::kConstant:
            return "constant";
        case LrDecayStyle::kLinear:
            return "linear";
        case LrDecayStyle::kCosine:
            return "cosine";
        case LrDecayStyle::kExponential:
            return "exponential";
    }
    return "?";
}

Result<LrSchedule> LrSchedule::make(double peak_lr, double min_lr, double warmup_fraction,
                                    int64_t decay_steps, LrDecayStyle style) {
    if (!(peak_lr >= 0.0) || !std::isfinite(peak_lr)) {
        return invalid_argument_error("learning rate must be a finite number >= 0, got {}",
                                      peak_lr);
    }
    if (!(min_lr >= 0.0) || min_lr > peak_lr) {
        return invalid_argument_error("min_lr must be in [0, lr={}], got {}", peak_lr, min_lr);
    }
    if (!(warmup_fraction >= 0.0 && warmup_fraction <= 1.0)) {
        return invalid_argument_error("warmup is a fraction of the decay steps in [0, 1], got {}",
                                      warmup_fraction);
    }
    if (decay_steps <= 0) {
        return invalid_argument_error("decay steps must be > 0, got {}", decay_steps);
    }
    LrSchedule s;
    s.peak_lr = peak_lr;
    s.min_lr = min_lr;
    s.warmup_steps = static_cast<int64_t>(warmup_fraction * static_cast<double>(decay_steps));
    s.decay_steps = decay_steps;
    s.style = style;
    return s;
}

double LrSchedule::lr_at(int64_t steps_done) const {
    const double W = static_cast<double>(warmup_steps);
    const double E = static_cast<double>(decay_steps);
    const double capped =
        static_cast<double>(std::min<int64_t>(steps_done, decay_steps - warmup_steps));
    if (warmup_steps > 0 && steps_done <= warmup_steps) return peak_lr * capped / W;
    const double n = capped - W;
    double lr = peak_lr;
    switch (style) {
        case LrDecayStyle::kLinear:
            lr = peak_lr * (E - n) / E;
            break;
        case LrDecayStyle::kCosine:
            lr = peak_lr / 2.0 * (std::cos(std::numbers::pi * n / E) + 1.0);
            break;
        case LrDecayStyle::kExponential:
            lr = peak_lr * std::exp(-0.693 * n / E);
            break;
        case LrDecayStyle::kConstant:
            lr = peak_lr;
            break;
    }
    return std::max(lr, min_lr);
}

}  // namespace lathe
