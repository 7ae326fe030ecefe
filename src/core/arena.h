#pragma once
// Arenas: one allocation carved into a table of named tensors (STYLE.md: "memory is a table of
// sizes carved from one allocation").
//
// An ArenaLayout is the table: names, dtypes, shapes and byte offsets, computed before anything is
// allocated, so the memory plan can print and check the peak up front. It knows nothing about where
// the bytes will live; HostArena owns host memory for a layout, and the CUDA backend owns device
// memory for the same layout (ArenaLayout::view takes any base pointer and a Device).
// Every entry starts at a multiple of the layout's alignment (256 bytes by default: what cuBLASLt
// and vectorized kernels want), so views carved from an aligned base are aligned too.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe {

struct ArenaEntry {
    std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
    DType dtype;
    Shape shape;
    size_t offset;  // from the arena base, a multiple of the layout's alignment
    size_t bytes;   // numel * dtype_size, before padding
};

class ArenaLayout {
public:
    static constexpr size_t kDefaultAlignment = 256;

    // `alignment` must be a power of two (checked).
    explicit ArenaLayout(size_t alignment = kDefaultAlignment);

    // Appends a tensor after the previous ones; returns its index. Fails (invalid argument) when
    // the name is empty or already in the table.
    Result<size_t> add(std::string name, DType dtype, Shape shape);
    // Leaves the bytes before `end` unused (zero in a new allocation): the next entry starts at
    // or after round_up(end, alignment()). No effect when the entries already reach `end`.
    void reserve_to(size_t end);

    // Index of the entry called `name`; not found names the arena's entry count.
    Result<size_t> find(std::string_view name) const;

    const std::vector<ArenaEntry>& entries() const { return entries_; }
    size_t size() const { return entries_.size(); }
    size_t alignment() const { return alignment_; }
    // Bytes an allocation for this layout needs (the end of the last entry, padded).
    size_t total_bytes() const { return total_bytes_; }

    // View of entry `index` inside an allocation starting at `base` in memory space `device`.
    // `base` must be aligned to alignment() (checked); index out of range is a bug (checked).
    TensorView view(void* base, size_t index, Device device) const;

    // One line per entry, "name dtype shape bytes", then the total: for memory-plan printouts.
    std::string describe() const;

private:
    size_t alignment_;
    size_t total_bytes_ = 0;
    std::vector<ArenaEntry> entries_;
    std::unordered_map<std::string, size_t> index_;
};

// Host memory for one ArenaLayout, zero-filled, aligned to the layout's alignment. Move-only.
class HostArena {
public:
    HostArena() = default;
    // Fails (failed precondition) when the host cannot provide total_bytes().
    static Result<HostArena> allocate(ArenaLayout layout);

    const ArenaLayout& layout() const { return layout_; }
    TensorView view(size_t index) { return layout_.view(base_.get(), index, Device::kCpu); }
    // View by name; not found when the layout has no such entry.
    Result<TensorView> view(std::string_view name);
    // The whole allocation as bytes.
    TensorView bytes() {
        return TensorView(base_.get(), DType::kU8, Shape{int64_t(layout_.total_bytes())});
    }
    // Sets every byte to zero (gradients before a step, say).
    void zero();

private:
    struct FreeAligned {
        void operator()(std::byte* p) const;
    };
    ArenaLayout layout_;
    std::unique_ptr<std::byte[], FreeAligned> base_;
};

}  // namespace lathe
