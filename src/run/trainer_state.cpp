#include "run/trainer_state.h"

namespace lathe {

nlohmann::json trainer_state_to_json(const TrainerState& s) {
    nlohmann::json j;
    j["step"] = s.step;
    j["adam_step"] = s.adam_step;
    j["skipped_steps"] = s.skipped_steps;
    j["skipped_in_a_row"] = s.skipped_in_a_row;
    j["loss_mean"] = s.loss_mean;
    j["loss_count"] = s.loss_count;
    j["interval_loss_sum"] = s.interval_loss_sum;
    j["interval_steps"] = s.interval_steps;
    j["eval_passes"] = s.eval_passes;
    j["consumed_train_samples"] = s.consumed_train_samples;
    j["tokens"] = s.tokens;
    j["lathe_version"] = LATHE_VERSION_STRING;
    return j;
}

Result<TrainerState> trainer_state_from_json(const nlohmann::json& j, const std::string& path) {
    if (!j.is_object()) return data_loss_error("{}: not a JSON object", path);
    TrainerState s;
    try {
        s.step = j.at("step").get<int64_t>();
        s.adam_step = j.at("adam_step").get<int64_t>();
        s.skipped_steps = j.at("skipped_steps").get<int64_t>();
        s.skipped_in_a_row = j.at("skipped_in_a_row").get<int64_t>();
        s.loss_mean = j.at("loss_mean").get<double>();
        s.loss_count = j.at("loss_count").get<int64_t>();
        s.interval_loss_sum = j.at("interval_loss_sum").get<double>();
        s.interval_steps = j.at("interval_steps").get<int64_t>();
        s.eval_passes = j.at("eval_passes").get<int64_t>();
        s.consumed_train_samples = j.value("consumed_train_samples", int64_t{0});
        s.tokens = j.value("tokens", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
        return data_loss_error("{}: {} (was it written by lathe?)", path, e.what());
    }
    if (s.step < 0 || s.adam_step < 0 || s.adam_step > s.step) {
        return data_loss_error("{}: inconsistent step {} / adam_step {}", path, s.step,
                               s.adam_step);
    }
    return s;
}

}  // namespace lathe
