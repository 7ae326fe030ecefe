#include "core/arena.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace lathe {

namespace {
size_t round_up(size_t n, size_t alignment) {
    return (n + alignment - 1) / alignment * alignment;
}
}  // namespace

ArenaLayout::ArenaLayout(size_t alignment) : alignment_(alignment) {
    LATHE_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0,
                "arena alignment {} is not a power of two", alignment);
}

Result<size_t> ArenaLayout::add(std::string name, DType dtype, Shape shape) {
    if (name.empty()) return invalid_argument_error("arena entry with an empty name");
    if (index_.count(name))
        return invalid_argument_error("arena entry '{}' added twice; names must be unique", name);
    ArenaEntry e{std::move(name), dtype, shape, round_up(total_bytes_, alignment_),
                 size_t(shape.numel()) * dtype_size(dtype)};
    total_bytes_ = round_up(e.offset + e.bytes, alignment_);
    index_.emplace(e.name, entries_.size());
    entries_.push_back(std::move(e));
    return entries_.size() - 1;
}

void ArenaLayout::reserve_to(size_t end) {
    total_bytes_ = std::max(total_bytes_, round_up(end, alignment_));
}

Result<size_t> ArenaLayout::find(std::string_view name) const {
    auto it = index_.find(std::string(name));
    if (it == index_.end())
        return not_found_error("no tensor '{}' among the {} entries of this arena", name,
                               entries_.size());
    return it->second;
}

TensorView ArenaLayout::view(void* base, size_t index, Device device) const {
    LATHE_CHECK(index < entries_.size(), "arena entry {} of {}", index, entries_.size());
    LATHE_CHECK(reinterpret_cast<uintptr_t>(base) % alignment_ == 0,
                "arena base {} not aligned to {}", base, alignment_);
    const ArenaEntry& e = entries_[index];
    return TensorView(static_cast<std::byte*>(base) + e.offset, e.dtype, e.shape, device);
}

std::string ArenaLayout::describe() const {
    std::string out;
    for (const ArenaEntry& e : entries_)
        out +=
            fmt::format("{} {} {} {}\n", e.name, dtype_name(e.dtype), e.shape.to_string(), e.bytes);
    out += fmt::format("total {} bytes in {} tensors\n", total_bytes_, entries_.size());
    return out;
}

Result<HostArena> HostArena::allocate(ArenaLayout layout) {
    HostArena arena;
    const size_t bytes = std::max(layout.total_bytes(), layout.alignment());
    void* p = std::aligned_alloc(layout.alignment(), round_up(bytes, layout.alignment()));
    if (p == nullptr)
        return failed_precondition_error(
            "cannot allocate {} bytes of host memory for an arena of {} tensors; reduce the batch "
            "or model size",
            layout.total_bytes(), layout.size());
    std::memset(p, 0, bytes);
    arena.base_.reset(static_cast<std::byte*>(p));
    arena.layout_ = std::move(layout);
    return arena;
}

Result<TensorView> HostArena::view(std::string_view name) {
    LATHE_ASSIGN_OR_RETURN(const size_t index, layout_.find(name));
    return view(index);
}

void HostArena::zero() {
    if (base_) std::memset(base_.get(), 0, layout_.total_bytes());
}

void HostArena::FreeAligned::operator()(std::byte* p) const {
    std::free(p);
}

}  // namespace lathe
