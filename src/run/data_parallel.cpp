#include "run/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <climits>

#include <fmt/format.h>

#include "core/check.h"
#include "model/memory_plan.h"
#include "ops/cuda/cuda_state.h"

namespace lathe {

namespace {

bool on_cuda(const Model& model) {
    return model.context().backend == Backend::kCuda;
}

}  // namespace

Result<std::unique_ptr<DataParallel>> DataParallel::create(Model& model, Communicator& comm,
                                                           int zero_stage) {
    if (zero_stage != 0 && zero_stage != 1) {
        return invalid_argument_error(
            "parallel.zero_stage {}: stages 0 (replicated optimizer) and 1 (optimizer state "
            "sharded) are built",
            zero_stage);
    }
    if (!model.training())
        return invalid_argument_error("data parallel training needs a model with gradients");
    const Device memory = on_cuda(model) ? Device::kCuda : Device::kCpu;
    if (!comm.accepts(memory)) {
        return invalid_argument_error(
            "the {} communicator does not take {} buffers: data parallel on the {} needs {}",
            comm.backend(), memory == Device::kCuda ? "GPU" : "CPU",
            memory == Device::kCuda ? "GPU" : "CPU",
            memory == Device::kCuda ? "NCCL" : "MPI (start with mpirun)");
    }
    const int64_t total = model.params_flat().numel();
    if (zero_stage == 1 && total % (kShardAlignElements * comm.size()) != 0) {
        return invalid_argument_error(
            "ZeRO-1 over {} ranks: the parameter arena of {} elements is not padded to {} "
            "shards (create the model with ModelShape::optimizer_shards = {})",
            comm.size(), total, comm.size(), comm.size());
    }
    std::unique_ptr<DataParallel> dp(new DataParallel(model, comm, zero_stage));
    return dp;
}

DataParallel::DataParallel(Model& model, Communicator& comm, int zero_stage)
    : model_(model), comm_(comm), zero_stage_(zero_stage) {
    total_ = model.params_flat().numel();
    used_ = int64_t(model.params().layout().total_bytes() / sizeof(float));
    if (zero_stage == 1) {
        const int64_t S = total_ / comm.size();
        range_ = FlatRange{comm.rank() * S, (comm.rank() + 1) * S};
    } else {
        range_ = FlatRange{0, total_};
    }
    // Flat element ranges of the entries, grouped by layer.
    const int L = int(model.config().num_layers);
    layer_ranges_.assign(size_t(L), FlatRange{INT64_MAX, 0});
    front_ = back_ = FlatRange{INT64_MAX, 0};
    const auto& arena = model.params().layout().entries();
    bool seen_layer = false;  // entries outside the blocks before the first layer are in front
    for (const ParamEntry& e : model.params().entries()) {
        const ArenaEntry& a = arena[e.arena_index];
        const int64_t b = int64_t(a.offset / sizeof(float)), n = int64_t(a.bytes / sizeof(float));
        seen_layer = seen_layer || e.layer >= 0;
        FlatRange& r = e.layer >= 0 ? layer_ranges_[size_t(e.layer)] : seen_layer ? back_ : front_;
        r.begin = std::min(r.begin, b);
        r.end = std::max(r.end, b + n);
    }
    for (FlatRange* r : {&front_, &back_})
        if (r->begin == INT64_MAX) *r = FlatRange{0, 0};
    for (int l = 0; l < L; ++l) {
        const FlatRange& r = layer_ranges_[size_t(l)];
        LATHE_CHECK(r.begin < r.end, "layer {} has no parameters", l);
        if (l > 0) {
            LATHE_CHECK(r.begin >= layer_ranges_[size_t(l - 1)].end,
                        "layer {}'s parameters are not after layer {}'s", l, l - 1);
        }
    }
    if (L > 0) {
        LATHE_CHECK((front_.size() == 0 || front_.end <= layer_ranges_[0].begin) &&
                        (back_.size() == 0 || back_.begin >= layer_ranges_[size_t(L - 1)].end),
                    "the entries outside the layers are not before and after them");
    }
    if (on_cuda(model)) {
        for (int i = 0; i < 2; ++i)
            events_.push_back(std::make_unique<CudaEvent>(CudaEvent::Timing::kOn));
        if (zero_stage == 1 && comm.size() > 1) {
            std::vector<FlatRange> order = {front_};
            order.insert(order.end(), layer_ranges_.begin(), layer_ranges_.end());
            order.push_back(back_);
            for (const FlatRange& r : order) {
                Piece p;
                p.range = r;
                p.ready = std::make_unique<CudaEvent>();
                p.wait_begin = std::make_unique<CudaEvent>(CudaEvent::Timing::kOn);
                p.wait_end = std::make_unique<CudaEvent>(CudaEvent::Timing::kOn);
                pieces_.push_back(std::move(p));
            }
            model_.set_weights_needed_hook([this](int piece) { on_weights_needed(piece); });
        }
    }
    model_.set_grads_ready_hook([this](int layer) { on_layer_ready(layer); });
}

DataParallel::~DataParallel() {
    if (!pieces_.empty()) wait_for_pieces();
    model_.set_grads_ready_hook({});
    model_.set_weights_needed_hook({});
}

void DataParallel::on_weights_needed(int piece) {
    const size_t i = piece == Model::kInputWeights    ? 0
                     : piece == Model::kOutputWeights ? pieces_.size() - 1
                                                      : size_t(piece) + 1;
    Piece& p = pieces_[i];
    if (!p.in_flight) return;
    CUstream_st* compute = model_.context().stream;
    p.wait_begin->record(compute);
    p.ready->wait(compute);
    p.wait_end->record(compute);
    p.in_flight = false;
    p.waited = true;
}

void DataParallel::wait_for_pieces() {
    CUstream_st* compute = model_.context().stream;
    for (Piece& p : pieces_) {
        if (!p.in_flight) continue;
        p.ready->wait(compute);
        p.in_flight = false;
    }
}

CUstream_st* DataParallel::stream() const {
    return on_cuda(model_) ? model_.context().stream : nullptr;
}

Status DataParallel::reduce_range(int64_t begin, int64_t end) {
    if (begin >= end) return ok_status();
    const TensorView grads = model_.grads_flat().slice(begin, end);
    if (!on_cuda(model_)) {
        const auto t0 = std::chrono::steady_clock::now();
        Status s = comm_.all_reduce(grads, grads, ReduceOp::kSum, nullptr);
        host_comm_ms_ +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        return s;
    }
    CudaState& state = cuda_state_of(model_.context(), "data parallel");
    state.wait_for(state.comm_stream(), state.stream());
    return comm_.all_reduce(grads, grads, ReduceOp::kSum, state.comm_stream());
}

void DataParallel::on_layer_ready(int layer) {
    if (!reducing_ || comm_.size() == 1) return;
    Status s;
    if (layer >= 0) {
        const FlatRange& r = layer_ranges_[size_t(layer)];
        s = reduce_range(r.begin, r.end);
    } else {
        s = reduce_range(back_.begin, back_.end);
        if (s.ok()) s = reduce_range(front_.begin, front_.end);
    }
    if (!s.ok() && first_error_.ok())
        first_error_ = s.with_context(layer >= 0 ? fmt::format("the gradients of layer {}", layer)
                                                 : std::string("the embedding/head gradients"));
}

Status DataParallel::finish_gradients() {
    reducing_ = false;
    if (on_cuda(model_) && comm_.size() > 1) {
        CudaState& state = cuda_state_of(model_.context(), "data parallel");
        events_[0]->record(state.stream());
        state.wait_for(state.stream(), state.comm_stream());
        events_[1]->record(state.stream());
        reduced_ = true;
    }
    Status s = first_error_;
    first_error_ = ok_status();
    return s;
}

Status DataParallel::finish_update() {
    if (zero_stage_ == 0 || comm_.size() == 1) return ok_status();
    const int64_t S = range_.size();
    if (!on_cuda(model_)) {
        const TensorView all = model_.params_flat();
        const auto t0 = std::chrono::steady_clock::now();
        Status s = comm_.all_gather(all, all.slice(range_.begin, range_.end), nullptr);
        host_comm_ms_ +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        return s;
    }
    // Each piece from the rank(s) whose shard holds it, in the next forward's order.
    CudaState& state = cuda_state_of(model_.context(), "data parallel");
    const TensorView all = model_.params_compute_flat();
    LATHE_CHECK(all.numel() == total_, "bf16 copy of {} elements for {} masters", all.numel(),
                total_);
    state.wait_for(state.comm_stream(), state.stream());
    for (Piece& p : pieces_) {
        for (int r = 0; r < comm_.size(); ++r) {
            const int64_t b = std::max(p.range.begin, r * S);
            const int64_t e = std::min(p.range.end, (r + 1) * S);
            if (b >= e) continue;
            LATHE_RETURN_IF_ERROR(comm_.broadcast(all.slice(b, e), r, state.comm_stream()));
        }
        p.ready->record(state.comm_stream());
        p.in_flight = true;
    }
    return ok_status();
}

Status DataParallel::gather_masters() {
    if (zero_stage_ == 0 || comm_.size() == 1 || !on_cuda(model_)) return ok_status();
    CudaState& state = cuda_state_of(model_.context(), "data parallel");
    wait_for_pieces();
    const TensorView all = model_.params_flat();
    state.wait_for(state.comm_stream(), state.stream());
    LATHE_RETURN_IF_ERROR(
        comm_.all_gather(all, all.slice(range_.begin, range_.end), state.comm_stream()));
    state.wait_for(state.stream(), state.comm_stream());
    state.synchronize();
    return ok_status();
}

double DataParallel::comm_wait_ms() {
    double ms = host_comm_ms_;
    host_comm_ms_ = 0.0;
    if (reduced_) {
        ms += CudaEvent::elapsed_ms(*events_[0], *events_[1]);
        reduced_ = false;
    }
    for (Piece& p : pieces_) {
        if (!p.waited) continue;
        ms += CudaEvent::elapsed_ms(*p.wait_begin, *p.wait_end);
        p.waited = false;
    }
    return ms;
}

}  // namespace lathe
