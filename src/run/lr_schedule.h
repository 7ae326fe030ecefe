#pragma once
// Learning-rate schedules exactly as GPT-NeoX's AnnealingLR (megatron/learning_rates.py) computes
// them, so a lathe run and a GPT-NeoX run with the same settings use the same rate at every step.
//
// With s = the number of optimizer steps already taken (the first step uses s = 0), W the warmup
// steps (GPT-NeoX: warmup fraction × decay steps), E the decay steps (lr_decay_iters, default the
// training steps), lr0 the peak rate and lr_min the floor:
//   warmup (W > 0 and s <= W):  lr = lr0 * min(s, E - W) / W
//   then with n = min(s, E - W) - W:
//     linear:      lr = lr0 * (E - n) / E
//     cosine:      lr = lr0 / 2 * (cos(pi * n / E) + 1)
//     exponential: lr = lr0 * exp(-0.693 * n / E)
//     constant:    lr = lr0
//   and the result is floored at lr_min.
// Note GPT-NeoX's own quirks, kept on purpose: decay runs over E (not E - W) and stops at
// s = E - W, so with warmup the rate never quite reaches lr_min unless the floor catches it.

#include <cstdint>
#include <string>

#include "core/status.h"

namespace lathe {

enum class LrDecayStyle { kConstant, kLinear, kCosine, kExponential };

// "constant" | "linear" | "cosine" | "exponential"; anything else is an error naming the choices.
Result<LrDecayStyle> lr_decay_style_from_string(const std::string& name);
const char* lr_decay_style_name(LrDecayStyle style);

struct LrSchedule {
    double peak_lr = 0.0;
    double min_lr = 0.0;
    int64_t warmup_steps = 0;  // W
    int64_t decay_steps = 1;   // E, > 0
    LrDecayStyle style = LrDecayStyle::kCosine;

    // Builds W = round-down(warmup_fraction * decay_steps) as GPT-NeoX does (int(warmup * iters)).
    static Result<LrSchedule> make(double peak_lr, double min_lr, double warmup_fraction,
                                   int64_t decay_steps, LrDecayStyle style);

    // The rate for the optimizer step taken after `steps_done` steps.
    double lr_at(int64_t steps_done) const;
};

}  // namespace lathe
