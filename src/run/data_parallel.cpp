#include "run/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/check.h"
#include "model/memory_plan.h"
#include "model/param_staging.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/memory.h"
#include "optim/optimizer_state.h"

namespace lathe {

namespace {

bool on_cuda(const Model& model) {
    return model.context().backend == Backend::kCuda;
}

}  // namespace

void data_parallel_shape(ModelShape& shape, int world, int zero_stage, int rank) {
    const int W = std::max(world, 1);
    shape.unit_shards = W;
    shape.optimizer_shards = zero_stage >= 1 ? W : 1;
    shape.gradient_shards = zero_stage >= 2 ? W : 1;
    shape.param_shards = zero_stage >= 3 ? W : 1;
    shape.shard_rank = W > 1 ? rank : 0;
}

Result<std::unique_ptr<DataParallel>> DataParallel::create(Model& model, Communicator& comm,
                                                           int zero_stage) {
    if (zero_stage < 0 || zero_stage > 3) {
        return invalid_argument_error(
            "parallel.zero_stage {}: stages 0 (replicated optimizer), 1 (optimizer state "
            "sharded), 2 (optimizer state and gradients sharded) and 3 (optimizer state, "
            "gradients and parameters sharded) are built; use one of them",
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
    const ShardLayout& sl = model.plan().shards;
    if (comm.size() > 1 && sl.world != comm.size()) {
        return invalid_argument_error(
            "data parallel over {} ranks: the parameter arena's units are padded for {} (create "
            "the model with ModelShape::unit_shards = {})",
            comm.size(), sl.world, comm.size());
    }
    const int want = zero_stage >= 1 ? comm.size() : 1;
    if (model.plan().shape.optimizer_shards != want) {
        return invalid_argument_error(
            "ZeRO-{} over {} ranks: the memory plan counts the moments of {} shards (create the "
            "model with ModelShape::optimizer_shards = {})",
            zero_stage, comm.size(), model.plan().shape.optimizer_shards, want);
    }
    const int want_grads = zero_stage >= 2 && comm.size() > 1 ? comm.size() : 1;
    if (model.plan().shape.gradient_shards != want_grads) {
        return invalid_argument_error(
            "ZeRO-{} over {} ranks: the memory plan shards the gradients over {} (create the "
            "model with ModelShape::gradient_shards = {})",
            zero_stage, comm.size(), model.plan().shape.gradient_shards, want_grads);
    }
    const int want_params = zero_stage >= 3 && comm.size() > 1 ? comm.size() : 1;
    if (model.plan().shape.param_shards != want_params ||
        (want_params > 1 && model.plan().shape.shard_rank != comm.rank())) {
        return invalid_argument_error(
            "ZeRO-{} over {} ranks, this one rank {}: the memory plan shards the parameters over "
            "{} for rank {} (create the model with ModelShape::param_shards = {}, shard_rank = "
            "{})",
            zero_stage, comm.size(), comm.rank(), model.plan().shape.param_shards,
            model.plan().shape.shard_rank, want_params, comm.rank());
    }
    std::unique_ptr<DataParallel> dp(new DataParallel(model, comm, zero_stage));
    return dp;
}

DataParallel::DataParallel(Model& model, Communicator& comm, int zero_stage)
    : model_(model), comm_(comm), zero_stage_(zero_stage), layout_(model.plan().shards) {
    LATHE_CHECK(layout_.total == model.params_total(),
                "shard layout of {} elements over an arena of {}", layout_.total,
                model.params_total());
    if (comm.size() > 1) {
        chunks_ = layout_.chunks(comm.rank());
    } else {
        for (const FlatRange& u : layout_.arena)
            if (u.size() > 0) chunks_.push_back(u);
    }
    if (zero_stage >= 1 && comm.size() > 1)
        ranges_ = chunks_;
    else
        ranges_ = {FlatRange{0, layout_.total}};
    sharded_ = zero_stage >= 2 && comm.size() > 1;
    params_sharded_ = zero_stage >= 3 && comm.size() > 1;
    const size_t U = layout_.units();
    prepared_.assign(U, 0);
    windows_.assign(U, TensorView());
    slot_of_.assign(U, -1);
    shard_at_.assign(U, 0);
    if (sharded_) {
        // The shard entry's place in grads_flat(), then each unit's chunk in unit order.
        const MemoryPlan& plan = model.plan();
        const int64_t base = int64_t(plan.gradients.entries()[plan.grad_shard].offset / 4);
        int64_t at = 0;
        for (size_t u = 0; u < U; ++u) {
            shard_at_[u] = at;
            const FlatRange c = layout_.chunk(u, comm.rank());
            if (c.size() > 0) norm_ranges_.push_back({base + at, base + at + c.size()});
            at += c.size();
        }
    } else {
        norm_ranges_ = chunks_;
    }
    if (on_cuda(model)) {
        for (int i = 0; i < 2; ++i)
            events_.push_back(std::make_unique<CudaEvent>(CudaEvent::Timing::kOn));
        if (comm.size() > 1) {
            for (size_t u = 0; u < U; ++u) unit_reduced_.push_back(std::make_unique<CudaEvent>());
            for (size_t i = 0; i < model.plan().grad_layer_windows.size(); ++i)
                window_free_.push_back(std::make_unique<CudaEvent>());
        }
        if ((zero_stage == 1 || zero_stage == 2) && comm.size() > 1) {
            for (size_t u = 0; u < layout_.units(); ++u) {
                Piece p;
                p.ready = std::make_unique<CudaEvent>();
                p.wait_begin = std::make_unique<CudaEvent>(CudaEvent::Timing::kOn);
                p.wait_end = std::make_unique<CudaEvent>(CudaEvent::Timing::kOn);
                pieces_.push_back(std::move(p));
            }
            model_.set_weights_needed_hook([this](int piece) { on_weights_needed(piece); });
        }
    }
    if (params_sharded_) {
        const MemoryPlan& plan = model.plan();
        std::vector<size_t> entries{plan.weight_front_window, plan.weight_back_window};
        entries.insert(entries.end(), plan.weight_layer_windows.begin(),
                       plan.weight_layer_windows.end());
        LATHE_CHECK(plan.weight_layer_windows.size() == size_t(kWeightLayerWindows),
                    "ZeRO-3 over a plan of {} layer weight windows",
                    plan.weight_layer_windows.size());
        for (const size_t e : entries) {
            WeightWindow w;
            if (e != MemoryPlan::kNoEntry) w.view = model.weight_arena_entry(e);
            if (on_cuda(model)) w.ready = std::make_unique<CudaEvent>();
            weight_windows_.push_back(std::move(w));
        }
        model_.set_weight_window_hook([this](int piece) { return on_weight_window(piece); });
    }
    model_.set_grads_ready_hook([this](int layer) { on_layer_ready(layer); });
    if (comm.size() > 1)
        model_.set_grad_window_hook([this](int piece) { return on_grad_window(piece); });
}

DataParallel::~DataParallel() {
    if (!pieces_.empty()) wait_for_pieces();
    for (WeightWindow& w : weight_windows_)
        if (w.pending) w.ready->wait(model_.context().stream);
    model_.set_grads_ready_hook({});
    model_.set_weights_needed_hook({});
    model_.set_weight_window_hook({});
    model_.set_grad_window_hook({});
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

void DataParallel::fill_window(size_t slot, size_t unit, bool use) {
    WeightWindow& w = weight_windows_[slot];
    if (w.unit != int64_t(unit) || w.version != version_) {
        // Every rank's chunk of the unit from its shard: the compute copy on CUDA, the masters
        // on the CPU (what each computes with).
        const FlatRange u = layout_.arena[unit];
        const int64_t len = u.size() / comm_.size();
        const bool cuda = on_cuda(model_);
        const TensorView shard = cuda ? model_.params_compute_flat() : model_.params_flat();
        const TensorView mine = shard.slice(shard_at_[unit], shard_at_[unit] + len);
        const TensorView all = w.view.slice(0, u.size());
        w.unit = int64_t(unit);
        w.version = version_;
        Status s;
        if (!cuda) {
            const auto t0 = std::chrono::steady_clock::now();
            s = comm_.all_gather(all, mine, nullptr);
            host_comm_ms_ +=
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
        } else {
            // After everything enqueued on the compute stream so far: the window's last reader
            // (the model asks for a piece once the ops of the one before are enqueued) and the
            // optimizer's update of the shard.
            CudaState& state = cuda_state_of(model_.context(), "data parallel");
            state.wait_for(state.comm_stream(), state.stream());
            s = comm_.all_gather(all, mine, state.comm_stream());
            w.ready->record(state.comm_stream());
            w.pending = true;
        }
        if (!s.ok()) {
            w.unit = -1;
            if (first_error_.ok())
                first_error_ = s.with_context(fmt::format("the gather of unit {}'s weights", unit));
        }
    }
    if (use) wait_for_window(slot);
}

void DataParallel::wait_for_window(size_t slot) {
    WeightWindow& w = weight_windows_[slot];
    if (!w.pending) return;
    CUstream_st* compute = model_.context().stream;
    if (waits_ < kTimedWaits) {
        if (waits_ == wait_begin_.size()) {
            wait_begin_.push_back(std::make_unique<CudaEvent>(CudaEvent::Timing::kOn));
            wait_end_.push_back(std::make_unique<CudaEvent>(CudaEvent::Timing::kOn));
        }
        wait_begin_[waits_]->record(compute);
        w.ready->wait(compute);
        wait_end_[waits_]->record(compute);
        ++waits_;
    } else {
        w.ready->wait(compute);
    }
    w.pending = false;
}

TensorView DataParallel::on_weight_window(int piece) {
    if (piece == Model::kInputWeights || piece == Model::kOutputWeights) {
        const size_t slot = piece == Model::kInputWeights ? 0 : 1;
        if (weight_windows_[slot].view.is_null()) return TensorView();
        fill_window(slot, unit_of_piece(piece), /*use=*/true);
        return weight_windows_[slot].view;
    }
    // The layer window holding the unit, else the one the previous layer does not use.
    const size_t unit = layout_.layer_unit(piece), first = 2, count = weight_windows_.size() - 2;
    auto holds = [&](size_t slot, size_t u) {
        return weight_windows_[slot].unit == int64_t(u) &&
               weight_windows_[slot].version == version_;
    };
    size_t slot = first;
    for (size_t i = first; i < first + count; ++i)
        if (holds(i, unit)) slot = i;
    if (!holds(slot, unit)) {
        for (size_t i = first; i < first + count; ++i) {
            if (weight_windows_[i].unit != int64_t(layout_.layer_unit(last_layer_))) {
                slot = i;
                break;
            }
        }
    }
    fill_window(slot, unit, /*use=*/true);
    if (piece != last_layer_) {
        // The layer computed next, in the order this one was reached in, travels meanwhile.
        const int next = piece + (piece > last_layer_ ? 1 : -1);
        const int L = int(layout_.units()) - 2;
        if (next >= 0 && next < L) {
            const size_t other = first + (slot - first + 1) % count;
            fill_window(other, layout_.layer_unit(next), /*use=*/false);
        }
        // The back unit (final norm, untied head) travels during the forward's last two layers.
        if (next > piece && piece >= L - 2 && !weight_windows_[1].view.is_null())
            fill_window(1, layout_.back(), /*use=*/false);
    }
    last_layer_ = piece;
    return weight_windows_[slot].view;
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

void DataParallel::begin_micro_batch(bool last) {
    ++micro_;
    ++epoch_;
    last_ = last;
    if (params_sharded_) {
        // The forward's first units travel while the batch is staged.
        last_layer_ = -1;
        if (!weight_windows_[0].view.is_null()) fill_window(0, ShardLayout::kFront, /*use=*/false);
        if (layout_.units() > 2) {
            size_t slot = 2;
            for (size_t i = 2; i < weight_windows_.size(); ++i)
                if (weight_windows_[i].unit == int64_t(layout_.layer_unit(0))) slot = i;
            fill_window(slot, layout_.layer_unit(0), /*use=*/false);
        }
    }
}

size_t DataParallel::unit_of_piece(int piece) const {
    return piece == Model::kInputWeights    ? ShardLayout::kFront
           : piece == Model::kOutputWeights ? layout_.back()
                                            : layout_.layer_unit(piece);
}

TensorView DataParallel::on_grad_window(int piece) {
    const size_t u = unit_of_piece(piece);
    if (prepared_[u] == epoch_) return windows_[u];
    prepared_[u] = epoch_;
    windows_[u] = TensorView();
    const FlatRange unit = layout_.arena[u];
    // The first micro-batch of a step finds zeros (zero_grads()) at ZeRO 0 and 1.
    if (unit.size() == 0 || (!sharded_ && micro_ <= 1)) return TensorView();
    const bool cuda = on_cuda(model_);
    CUstream_st* compute = model_.context().stream;
    const FlatRange c = layout_.chunk(u, comm_.rank());
    // The buffer unit u's gradients collect in this micro-batch, and this rank's chunk of it.
    TensorView buffer, shard_chunk;
    int slot = -1;
    if (sharded_) {
        const MemoryPlan& plan = model_.plan();
        size_t entry = 0;
        if (u == ShardLayout::kFront) {
            entry = plan.grad_front_window;
        } else if (u == layout_.back()) {
            entry = plan.grad_back_window;
        } else {
            slot = next_slot_;
            next_slot_ = (next_slot_ + 1) % int(plan.grad_layer_windows.size());
            entry = plan.grad_layer_windows[size_t(slot)];
        }
        buffer = model_.gradient_arena_entry(entry).slice(0, unit.size());
        shard_chunk = model_.gradient_arena_entry(plan.grad_shard)
                          .slice(shard_at_[u], shard_at_[u] + c.size());
        if (cuda && slot >= 0) window_free_[size_t(slot)]->wait(compute);
    } else {
        buffer = model_.grads_flat().slice(unit.begin, unit.end);
    }
    slot_of_[u] = slot;
    // The reduction of the micro-batch before wrote this unit's chunk (and read its buffer).
    if (cuda) unit_reduced_[u]->wait(compute);
    const int64_t b = c.begin - unit.begin, e = c.end - unit.begin, n = unit.size();
    if (cuda) {
        if (b > 0) cuda_fill_bytes(buffer.slice(0, b), 0, compute);
        if (e < n) cuda_fill_bytes(buffer.slice(e, n), 0, compute);
        if (sharded_) cuda_copy_async(buffer.slice(b, e), shard_chunk, compute);
    } else {
        float* p = buffer.as<float>();
        std::fill(p, p + b, 0.0f);
        std::fill(p + e, p + n, 0.0f);
        if (sharded_) {
            const float* from = shard_chunk.as<float>();
            std::copy(from, from + (e - b), p + b);
        }
    }
    if (sharded_) windows_[u] = buffer;
    return windows_[u];
}

Status DataParallel::reduce_unit(size_t unit) {
    const FlatRange u = layout_.arena[unit];
    if (u.size() == 0) return ok_status();
    // A unit the backward wrote nothing into still joins the reduction (its zeros).
    on_grad_window(unit == ShardLayout::kFront ? Model::kInputWeights
                   : unit == layout_.back()    ? Model::kOutputWeights
                                               : int(unit) - 1);
    const FlatRange c = layout_.chunk(unit, comm_.rank());
    TensorView all, mine;
    if (sharded_) {
        all = windows_[unit];
        mine = model_.gradient_arena_entry(model_.plan().grad_shard)
                   .slice(shard_at_[unit], shard_at_[unit] + c.size());
    } else {
        const TensorView grads = model_.grads_flat();
        all = grads.slice(u.begin, u.end);
        mine = grads.slice(c.begin, c.end);
    }
    const bool gather = zero_stage_ == 0 && last_;
    if (!on_cuda(model_)) {
        const auto t0 = std::chrono::steady_clock::now();
        Status s = comm_.reduce_scatter(mine, all, ReduceOp::kSum, nullptr);
        if (s.ok() && gather) s = comm_.all_gather(all, mine, nullptr);
        host_comm_ms_ +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        return s;
    }
    CudaState& state = cuda_state_of(model_.context(), "data parallel");
    state.wait_for(state.comm_stream(), state.stream());
    LATHE_RETURN_IF_ERROR(comm_.reduce_scatter(mine, all, ReduceOp::kSum, state.comm_stream()));
    if (gather) LATHE_RETURN_IF_ERROR(comm_.all_gather(all, mine, state.comm_stream()));
    unit_reduced_[unit]->record(state.comm_stream());
    if (slot_of_[unit] >= 0) window_free_[size_t(slot_of_[unit])]->record(state.comm_stream());
    return ok_status();
}

void DataParallel::on_layer_ready(int layer) {
    if (comm_.size() == 1) return;
    Status s;
    if (layer >= 0) {
        s = reduce_unit(layout_.layer_unit(layer));
    } else {
        s = reduce_unit(layout_.back());
        if (s.ok()) s = reduce_unit(ShardLayout::kFront);
    }
    if (!s.ok() && first_error_.ok())
        first_error_ = s.with_context(layer >= 0 ? fmt::format("the gradients of layer {}", layer)
                                                 : std::string("the embedding/head gradients"));
}

void DataParallel::exclude_from_norm(std::span<const FlatRange> arena) {
    // norm_ranges_[i] is chunks_[i] where the sum reads it (the arena, or the ZeRO-2 shard).
    LATHE_CHECK(norm_ranges_.size() == chunks_.size(), "{} norm ranges for {} chunks",
                norm_ranges_.size(), chunks_.size());
    std::vector<FlatRange> kept;
    for (size_t i = 0; i < chunks_.size(); ++i) {
        const FlatRange c = chunks_[i];
        LATHE_CHECK(norm_ranges_[i].size() == c.size(), "norm range {} of {} for a chunk of {}", i,
                    norm_ranges_[i].size(), c.size());
        const int64_t shift = norm_ranges_[i].begin - c.begin;
        // c minus every excluded range, in order.
        std::vector<FlatRange> cut;
        for (const FlatRange& x : arena)
            if (x.end > c.begin && x.begin < c.end)
                cut.push_back({std::max(x.begin, c.begin), std::min(x.end, c.end)});
        std::sort(cut.begin(), cut.end(),
                  [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
        int64_t at = c.begin;
        for (const FlatRange& x : cut) {
            if (x.begin > at) kept.push_back({at + shift, x.begin + shift});
            at = std::max(at, x.end);
        }
        if (at < c.end) kept.push_back({at + shift, c.end + shift});
    }
    norm_ranges_ = std::move(kept);
}

float DataParallel::set_grad_norm(std::span<const double> rank_sums) {
    double sum = 0.0;
    for (const double s : rank_sums) sum += s;
    const float norm = float(std::sqrt(sum));
    model_.set_grad_norm_value(norm);
    return norm;
}

std::vector<TensorView> DataParallel::gradient_pieces(std::span<const FlatRange> arena) const {
    std::vector<TensorView> out;
    const TensorView all = model_.grads_flat();
    if (!sharded_) {
        for (const FlatRange& r : arena) out.push_back(all.slice(r.begin, r.end));
        return out;
    }
    const TensorView shard = model_.gradient_arena_entry(model_.plan().grad_shard);
    for (const FlatRange& r : arena) {
        for (size_t u = 0; u < layout_.units(); ++u) {
            const FlatRange c = layout_.chunk(u, comm_.rank());
            const int64_t b = std::max(r.begin, c.begin), e = std::min(r.end, c.end);
            if (e <= b) continue;
            out.push_back(shard.slice(shard_at_[u] + (b - c.begin), shard_at_[u] + (e - c.begin)));
        }
    }
    return out;
}

void DataParallel::zero_grad_entry(size_t index) {
    if (!sharded_) {
        model_.zero_grad_entry(index);
        return;
    }
    const ArenaEntry& a =
        model_.plan().params.entries()[model_.params().entries().at(index).arena_index];
    const int64_t lo = int64_t(a.offset / sizeof(float)), hi = lo + a.shape.numel();
    const TensorView shard = model_.gradient_arena_entry(model_.plan().grad_shard);
    for (size_t u = 0; u < layout_.units(); ++u) {
        const FlatRange c = layout_.chunk(u, comm_.rank());
        const int64_t b = std::max(lo, c.begin), e = std::min(hi, c.end);
        if (e <= b) continue;
        const TensorView part =
            shard.slice(shard_at_[u] + (b - c.begin), shard_at_[u] + (e - c.begin));
        if (on_cuda(model_))
            cuda_fill_bytes(part, 0, model_.context().stream);
        else
            std::fill(part.as<float>(), part.as<float>() + part.numel(), 0.0f);
    }
}

Status DataParallel::finish_gradients() {
    micro_ = 0;
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
    LATHE_CHECK(micro_ == 0, "finish_update() inside a step: finish_gradients() first");
    if (params_sharded_) {
        // Every window holds weights of before the update; the next forward gathers again.
        ++version_;
        return ok_status();
    }
    if (!on_cuda(model_)) {
        const TensorView all = model_.params_flat();
        const auto t0 = std::chrono::steady_clock::now();
        Status s = ok_status();
        for (size_t u = 0; u < layout_.units() && s.ok(); ++u) {
            const FlatRange unit = layout_.arena[u], c = layout_.chunk(u, comm_.rank());
            if (unit.size() == 0) continue;
            s = comm_.all_gather(all.slice(unit.begin, unit.end), all.slice(c.begin, c.end),
                                 nullptr);
        }
        host_comm_ms_ +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        return s;
    }
    // Unit by unit in the next forward's order, each all-gathered in place.
    CudaState& state = cuda_state_of(model_.context(), "data parallel");
    const TensorView all = model_.params_compute_flat();
    LATHE_CHECK(all.numel() == layout_.total, "bf16 copy of {} elements for {} masters",
                all.numel(), layout_.total);
    state.wait_for(state.comm_stream(), state.stream());
    for (size_t u = 0; u < layout_.units(); ++u) {
        const FlatRange unit = layout_.arena[u], c = layout_.chunk(u, comm_.rank());
        if (unit.size() > 0)
            LATHE_RETURN_IF_ERROR(comm_.all_gather(all.slice(unit.begin, unit.end),
                                                   all.slice(c.begin, c.end), state.comm_stream()));
        pieces_[u].ready->record(state.comm_stream());
        pieces_[u].in_flight = true;
    }
    return ok_status();
}

Status DataParallel::gather_masters() {
    if (zero_stage_ == 0 || params_sharded_ || comm_.size() == 1 || !on_cuda(model_))
        return ok_status();
    CudaState& state = cuda_state_of(model_.context(), "data parallel");
    wait_for_pieces();
    const TensorView all = model_.params_flat();
    state.wait_for(state.comm_stream(), state.stream());
    for (size_t u = 0; u < layout_.units(); ++u) {
        const FlatRange unit = layout_.arena[u], c = layout_.chunk(u, comm_.rank());
        if (unit.size() == 0) continue;
        LATHE_RETURN_IF_ERROR(comm_.all_gather(all.slice(unit.begin, unit.end),
                                               all.slice(c.begin, c.end), state.comm_stream()));
    }
    state.wait_for(state.stream(), state.comm_stream());
    state.synchronize();
    return ok_status();
}

Status DataParallel::gather_params(ParamStaging* staging) {
    LATHE_CHECK(params_sharded_, "gather_params: the parameters are not sharded (ZeRO-{})",
                zero_stage_);
    LATHE_CHECK(micro_ == 0, "gather_params() inside a step");
    const MemoryPlan& plan = model_.plan();
    const bool cuda = on_cuda(model_);
    CUstream_st* compute = model_.context().stream;
    if (cuda) {
        // No reduction still reads a gradient window.
        CudaState& state = cuda_state_of(model_.context(), "data parallel");
        state.wait_for(state.stream(), state.comm_stream());
    }
    const TensorView shard = model_.params_flat();
    const std::vector<ArenaEntry>& entries = plan.params.entries();
    for (size_t u = 0; u < layout_.units(); ++u) {
        const FlatRange unit = layout_.arena[u];
        if (unit.size() == 0) continue;
        const size_t window = u == ShardLayout::kFront ? plan.grad_front_window
                              : u == layout_.back()    ? plan.grad_back_window
                                                       : plan.grad_layer_windows.at(0);
        const TensorView all = model_.gradient_arena_entry(window).slice(0, unit.size());
        const int64_t len = unit.size() / comm_.size();
        LATHE_RETURN_IF_ERROR(
            comm_
                .all_gather(all, shard.slice(shard_at_[u], shard_at_[u] + len),
                            cuda ? compute : nullptr)
                .with_context(fmt::format("gathering unit {} of the parameters", u)));
        if (staging == nullptr) continue;
        for (size_t i = 0; i < entries.size(); ++i) {
            const int64_t at = int64_t(entries[i].offset / sizeof(float));
            if (at < unit.begin || at >= unit.end) continue;
            const TensorView host = staging->host(i);
            const TensorView to = host.reshape(Shape{host.numel()});
            const TensorView from = all.slice(at - unit.begin, at - unit.begin + host.numel());
            if (cuda)
                cuda_copy_sync(to, from, compute);
            else
                std::memcpy(to.data(), from.data(), size_t(from.bytes()));
        }
    }
    if (cuda) model_.synchronize();
    return ok_status();
}

int64_t DataParallel::moment_offset(const AdamWOptimizer& optimizer, int64_t at) {
    int64_t offset = 0;
    for (const FlatRange& r : optimizer.ranges()) {
        if (at >= r.begin && at < r.end) return offset + (at - r.begin);
        offset += r.size();
    }
    LATHE_CHECK(false, "element {} is outside the optimizer's ranges", at);
    return -1;
}

Status DataParallel::save_optimizer(const AdamWOptimizer& optimizer, const std::string& dir) const {
    const int64_t n = optimizer.numel();
    std::vector<float> m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    optimizer.read_state(m, v);
    if (zero_stage_ == 0) {
        // Every rank holds the whole state: rank 0 writes the canonical vector as the full file.
        if (comm_.rank() != 0) return ok_status();
        std::vector<float> cm, cv;
        cm.reserve(size_t(layout_.used));
        cv.reserve(size_t(layout_.used));
        for (size_t u = 0; u < layout_.units(); ++u) {
            const int64_t at = layout_.arena[u].begin, len = layout_.canonical[u].size();
            cm.insert(cm.end(), m.begin() + at, m.begin() + at + len);
            cv.insert(cv.end(), v.begin() + at, v.begin() + at + len);
        }
        return optimizer_state_write(
            (std::filesystem::path(dir) / kOptimizerStateFullName).string(), cm, cv);
    }
    // Each chunk's own elements are its front (the padding is at its unit's end).
    std::vector<FlatRange> canonical;
    std::vector<float> cm, cv;
    for (const FlatRange& c : chunks_) {
        const std::vector<FlatRange> own = layout_.to_canonical(std::span<const FlatRange>(&c, 1));
        if (own.empty()) continue;
        const int64_t at = moment_offset(optimizer, c.begin), len = own[0].size();
        cm.insert(cm.end(), m.begin() + at, m.begin() + at + len);
        cv.insert(cv.end(), v.begin() + at, v.begin() + at + len);
        canonical.push_back(own[0]);
    }
    return optimizer_state_save_shard(cm, cv, canonical, dir, comm_.rank(), comm_.size(),
                                      layout_.used);
}

void DataParallel::canonical_ranges(const AdamWOptimizer& optimizer,
                                    std::vector<FlatRange>& canonical,
                                    std::vector<int64_t>& offsets) const {
    // The arena ranges this rank's moments hold: its chunks (ZeRO-1) or every unit (ZeRO-0).
    std::vector<FlatRange> mine;
    for (const FlatRange& r : optimizer.ranges()) {
        for (const FlatRange& u : layout_.arena) {
            const FlatRange x{std::max(r.begin, u.begin), std::min(r.end, u.end)};
            if (x.size() > 0) mine.push_back(x);
        }
    }
    canonical.clear();
    offsets.clear();  // [i] the moment offset of canonical[i]'s first element
    for (const FlatRange& r : mine) {
        const std::vector<FlatRange> c = layout_.to_canonical(std::span<const FlatRange>(&r, 1));
        if (c.empty()) continue;
        canonical.push_back(c[0]);
        offsets.push_back(moment_offset(optimizer, r.begin));
    }
}

Status DataParallel::load_optimizer(AdamWOptimizer& optimizer, const std::string& dir) const {
    std::vector<FlatRange> canonical;
    std::vector<int64_t> offsets;
    canonical_ranges(optimizer, canonical, offsets);
    int64_t k = 0;
    for (const FlatRange& c : canonical) k += c.size();
    std::vector<float> cm(static_cast<size_t>(k)), cv(static_cast<size_t>(k));
    LATHE_RETURN_IF_ERROR(optimizer_state_load_ranges(dir, layout_.used, canonical, cm, cv));
    std::vector<float> m(size_t(optimizer.numel()), 0.0f), v(size_t(optimizer.numel()), 0.0f);
    int64_t at = 0;
    for (size_t i = 0; i < canonical.size(); ++i) {
        const int64_t len = canonical[i].size();
        std::copy(cm.begin() + at, cm.begin() + at + len, m.begin() + offsets[i]);
        std::copy(cv.begin() + at, cv.begin() + at + len, v.begin() + offsets[i]);
        at += len;
    }
    optimizer.write_state(m, v);
    return ok_status();
}

void DataParallel::load_optimizer_canonical(AdamWOptimizer& optimizer,
                                            std::span<const float> exp_avg,
                                            std::span<const float> exp_avg_sq) const {
    LATHE_CHECK(
        int64_t(exp_avg.size()) == layout_.used && int64_t(exp_avg_sq.size()) == layout_.used,
        "canonical moments of {} and {} elements for a model of {}", exp_avg.size(),
        exp_avg_sq.size(), layout_.used);
    std::vector<FlatRange> canonical;
    std::vector<int64_t> offsets;
    canonical_ranges(optimizer, canonical, offsets);
    std::vector<float> m(size_t(optimizer.numel()), 0.0f), v(size_t(optimizer.numel()), 0.0f);
    for (size_t i = 0; i < canonical.size(); ++i) {
        const FlatRange c = canonical[i];
        std::copy(exp_avg.begin() + c.begin, exp_avg.begin() + c.end, m.begin() + offsets[i]);
        std::copy(exp_avg_sq.begin() + c.begin, exp_avg_sq.begin() + c.end, v.begin() + offsets[i]);
    }
    optimizer.write_state(m, v);
}

Status DataParallel::check_checkpoint(const std::string& dir) const {
    return optimizer_state_check_checkpoint(dir, layout_.used);
}

double DataParallel::comm_wait_ms() {
    double ms = host_comm_ms_;
    host_comm_ms_ = 0.0;
    if (reduced_) {
        ms += CudaEvent::elapsed_ms(*events_[0], *events_[1]);
        reduced_ = false;
    }
    for (size_t i = 0; i < waits_; ++i) ms += CudaEvent::elapsed_ms(*wait_begin_[i], *wait_end_[i]);
    waits_ = 0;
    for (Piece& p : pieces_) {
        if (!p.waited) continue;
        ms += CudaEvent::elapsed_ms(*p.wait_begin, *p.wait_end);
        p.waited = false;
    }
    return ms;
}

}  // namespace lathe
