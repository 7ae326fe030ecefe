// clang-format off
#include "ops/cuda/nvcc_compat.h"  // first: before any header that includes fmt
// clang-format on

// The one translation unit that includes the cuDNN frontend (a large header-only library): keep it
// that way, so the rest of the backend compiles at its usual speed.

#include <cuda_runtime.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>

#include "core/check.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_state.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/lru_cache.h"

#if LATHE_HAVE_CUDNN_FRONTEND
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace lathe {

#if LATHE_HAVE_CUDNN_FRONTEND

namespace fe = cudnn_frontend;

namespace {

// A cached graph and the variant pack it executes with. The pack's keys (tensor uids) are fixed
// at build time; each call only overwrites the pointers, so executing allocates nothing.
struct AttentionGraph {
    std::shared_ptr<fe::graph::Graph> graph;
    std::unordered_map<int64_t, void*> pack;
    int64_t workspace_bytes = 0;
};

enum class Direction : int64_t { kForward = 0, kBackward = 1 };

using GraphKey = std::array<int64_t, 14>;
struct GraphKeyHash {
    size_t operator()(const GraphKey& k) const {
        uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
        for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
        return size_t(h);
    }
};

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kBias, kDO, kDQ, kDK, kDV };

}  // namespace

struct CudaState::AttentionCache {
    cudnnHandle_t handle = nullptr;
    LruCache<GraphKey, std::unique_ptr<AttentionGraph>, GraphKeyHash> graphs{
        cuda::kAttentionGraphLimit};
    // Backward shape (with its workspace cap) -> the batch chunk its graph runs on (bounded alike;
    // an evicted decision is made again, to the same chunk).
    LruCache<GraphKey, int64_t, GraphKeyHash> backward_chunks{cuda::kAttentionGraphLimit};
    DeviceBuffer workspace;  // the largest workspace a graph ran with that the loan did not fit
    DeviceBuffer bias;       // the docs bias, (B, 1, T, T) bf16 of the largest docs shape
    void* lent = nullptr;    // attention_lend_workspace's memory, or null
    size_t lent_bytes = 0;

    ~AttentionCache() {
        if (handle != nullptr) cudnnDestroy(handle);
    }
};

void CudaState::AttentionCacheDeleter::operator()(AttentionCache* cache) const {
    delete cache;
}

CudaState::AttentionCache& CudaState::attention_cache() {
    if (attention_cache_ == nullptr) {
        std::unique_ptr<AttentionCache, AttentionCacheDeleter> cache(new AttentionCache);
        LATHE_CUDA_CHECK(cudaSetDevice(device_));
        const cudnnStatus_t created = cudnnCreate(&cache->handle);
        LATHE_CHECK(created == CUDNN_STATUS_SUCCESS,
                    "cudnnCreate: {} (is libcudnn {}.x installed and a GPU visible?)",
                    cudnnGetErrorString(created), CUDNN_MAJOR);
        const cudnnStatus_t bound = cudnnSetStream(cache->handle, stream_);
        LATHE_CHECK(bound == CUDNN_STATUS_SUCCESS, "cudnnSetStream: {}",
                    cudnnGetErrorString(bound));
        attention_cache_ = std::move(cache);
    }
    return *attention_cache_;
}

namespace cuda {

namespace {

// Keys the queries see (T in the training form), rows per batch row in the k/v buffers, and
// whether the shape is the cache form (queries at Tkv - T .. Tkv - 1, bottom-right aligned).
int64_t kv_len(const AttentionShape& s) {
    return s.Tkv > 0 ? s.Tkv : s.T;
}
int64_t kv_rows(const AttentionShape& s) {
    return s.kv_rows > 0 ? s.kv_rows : kv_len(s);
}
bool continues_cache(const AttentionShape& s) {
    return kv_len(s) != s.T;
}

// cuDNN's diagonal band takes a left bound only below the key count; a window of that many keys
// or more hides nothing (the last query, at kv_len - 1, sees key 0).
int64_t effective_window(const AttentionShape& s) {
    return s.window > 0 && s.window < kv_len(s) ? s.window : 0;
}

GraphKey graph_key(Direction dir, const AttentionShape& s) {
    const bool nondeterministic = dir == Direction::kBackward && s.nondeterministic_backward;
    return {int64_t(dir),
            s.B,
            s.T,
            s.H,
            s.Hkv,
            s.D,
            effective_window(s),
            s.docs ? 1 : 0,
            int64_t(std::bit_cast<uint32_t>(s.scale)),
            nondeterministic ? 1 : 0,
            s.Tkv,
            s.kv_rows,
            s.qkv_heads,
            0};
}

// The key of the batch-chunk decision for a backward shape: the graph key plus the cap.
GraphKey chunk_key(const AttentionShape& s) {
    GraphKey key = graph_key(Direction::kBackward, s);
    key.back() = int64_t(s.backward_workspace_cap);
    return key;
}

std::string shape_text(Direction dir, const AttentionShape& s) {
    return fmt::format(
        "attention {} B={} T={} H={} Hkv={} D={} window={} docs={} scale={}{}{}",
        dir == Direction::kForward    ? "forward"
        : s.nondeterministic_backward ? "backward (nondeterministic)"
                                      : "backward",
        s.B, s.T, s.H, s.Hkv, s.D, s.window, s.docs ? "yes" : "no", s.scale,
        s.Tkv > 0 ? fmt::format(" Tkv={} kv_rows={}", s.Tkv, kv_rows(s)) : std::string(),
        s.qkv_heads > 0 ? fmt::format(" packed in {} heads", s.qkv_heads) : std::string());
}

void expect_ok(fe::error_t status, const char* step, Direction dir, const AttentionShape& s) {
    LATHE_CHECK(status.is_good(), "cuDNN frontend {} failed for {} (cuDNN {}): {}", step,
                shape_text(dir, s), cudnnGetVersion(), status.get_message());
}

// Heads per token row in the storage of q, k, v (and dq, dk, dv): their own, or the packed
// buffer's (AttentionShape::qkv_heads).
int64_t stored_heads(const AttentionShape& s, int64_t heads) {
    return s.qkv_heads > 0 ? s.qkv_heads : heads;
}

// (B, rows, stored, D) storage seen as cuDNN's logical (B, heads, T, D): the first T of `rows`
// rows per batch row, `heads` of the `stored` heads of each row (from the pointer the call sets).
fe::graph::Tensor_attributes btnd(const char* name, int64_t uid, const AttentionShape& s,
                                  int64_t heads, int64_t T, int64_t rows, int64_t stored) {
    return fe::graph::Tensor_attributes()
        .set_name(name)
        .set_uid(uid)
        .set_dim({s.B, heads, T, s.D})
        .set_stride({rows * stored * s.D, s.D, stored * s.D, 1})
        .set_data_type(fe::DataType_t::BFLOAT16);
}
fe::graph::Tensor_attributes btnd(const char* name, int64_t uid, const AttentionShape& s,
                                  int64_t heads) {
    return btnd(name, uid, s, heads, s.T, s.T, heads);
}

fe::graph::Tensor_attributes stats_tensor(const AttentionShape& s) {
    return fe::graph::Tensor_attributes()
        .set_name("lse")
        .set_uid(kStats)
        .set_dim({s.B, s.H, s.T, 1})
        .set_stride({s.H * s.T, s.T, 1, 1})
        .set_data_type(fe::DataType_t::FLOAT);
}

fe::graph::Tensor_attributes bias_tensor(const AttentionShape& s) {
    return fe::graph::Tensor_attributes()
        .set_name("docs_bias")
        .set_uid(kBias)
        .set_dim({s.B, 1, s.T, s.T})
        .set_stride({s.T * s.T, s.T * s.T, s.T, 1})
        .set_data_type(fe::DataType_t::BFLOAT16);
}

// Causal (top-left diagonal, right bound 0) plus the window as the band's left bound: cuDNN keeps
// key j for query t when j <= t and j + window > t, our visible(t, j).
// The cache form aligns the diagonal bottom-right instead: query i (at position Tkv - T + i) keeps
// key j when j <= Tkv - T + i and j + window > Tkv - T + i.
template <class Attributes>
void set_mask(Attributes& a, const AttentionShape& s) {
    a.set_diagonal_alignment(continues_cache(s) ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                : fe::DiagonalAlignment_t::TOP_LEFT)
        .set_diagonal_band_right_bound(0);
    if (effective_window(s) > 0) a.set_diagonal_band_left_bound(int(effective_window(s)));
}

// Builds the graph of (dir, s). A failing step stops naming the shape and cuDNN's reason, unless
// `may_decline` (the cache form, which the caller can run on its own kernel): then null.
std::unique_ptr<AttentionGraph> build_graph(cudnnHandle_t handle, Direction dir,
                                            const AttentionShape& s, bool may_decline = false) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t qs = stored_heads(s, s.H), kvs = stored_heads(s, s.Hkv);
    auto q = g->tensor(btnd("q", kQ, s, s.H, s.T, s.T, qs));
    auto k = g->tensor(btnd("k", kK, s, s.Hkv, kv_len(s), kv_rows(s), kvs));
    auto v = g->tensor(btnd("v", kV, s, s.Hkv, kv_len(s), kv_rows(s), kvs));
    auto result = std::make_unique<AttentionGraph>();
    std::vector<int64_t> uids = {kQ, kK, kV};
    if (dir == Direction::kForward) {
        auto attrs = fe::graph::SDPA_attributes()
                         .set_name("attention_forward")
                         .set_generate_stats(true)
                         .set_attn_scale(s.scale);
        set_mask(attrs, s);
        if (s.docs) attrs.set_bias(g->tensor(bias_tensor(s)));
        auto [o, stats] = g->sdpa(q, k, v, attrs);
        o->set_output(true)
            .set_uid(kO)
            .set_dim({s.B, s.H, s.T, s.D})
            .set_stride({s.T * s.H * s.D, s.D, s.H * s.D, 1})
            .set_data_type(fe::DataType_t::BFLOAT16);
        stats->set_output(true)
            .set_uid(kStats)
            .set_dim({s.B, s.H, s.T, 1})
            .set_stride({s.H * s.T, s.T, 1, 1})
            .set_data_type(fe::DataType_t::FLOAT);
        uids.insert(uids.end(), {kO, kStats});
    } else {
        auto o = g->tensor(btnd("out", kO, s, s.H));
        auto dout = g->tensor(btnd("dout", kDO, s, s.H));
        auto stats = g->tensor(stats_tensor(s));
        auto attrs = fe::graph::SDPA_backward_attributes()
                         .set_name("attention_backward")
                         .set_attn_scale(s.scale)
                         .set_deterministic_algorithm(!s.nondeterministic_backward);
        set_mask(attrs, s);
        if (s.docs) attrs.set_bias(g->tensor(bias_tensor(s)));
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
        dq->set_output(true)
            .set_uid(kDQ)
            .set_dim({s.B, s.H, s.T, s.D})
            .set_stride({s.T * qs * s.D, s.D, qs * s.D, 1})
            .set_data_type(fe::DataType_t::BFLOAT16);
        for (auto [t, uid] : {std::pair{dk, kDK}, std::pair{dv, kDV}})
            t->set_output(true)
                .set_uid(uid)
                .set_dim({s.B, s.Hkv, s.T, s.D})
                .set_stride({s.T * kvs * s.D, s.D, kvs * s.D, 1})
                .set_data_type(fe::DataType_t::BFLOAT16);
        uids.insert(uids.end(), {kO, kDO, kStats, kDQ, kDK, kDV});
    }
    if (s.docs) uids.push_back(kBias);

    auto ok = [&](fe::error_t status, const char* step) {
        if (may_decline && !status.is_good()) return false;
        expect_ok(status, step, dir, s);
        return true;
    };
    if (!ok(g->validate(), "validate") ||
        !ok(g->build_operation_graph(handle), "build_operation_graph") ||
        !ok(g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
            "create_execution_plans") ||
        !ok(g->check_support(handle), "check_support") ||
        !ok(g->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans"))
        return nullptr;
    int64_t ws = 0;
    expect_ok(g->get_workspace_size(ws), "get_workspace_size", dir, s);
    LATHE_CHECK(ws >= 0, "{}: cuDNN reports a workspace of {} bytes", shape_text(dir, s), ws);
    result->graph = std::move(g);
    result->workspace_bytes = ws;
    for (int64_t uid : uids) result->pack.emplace(uid, nullptr);
    return result;
}

size_t bias_bytes(const AttentionShape& s) {
    return s.docs ? size_t(s.B) * size_t(s.T) * size_t(s.T) * sizeof(bf16) : 0;
}

// Grows `buffer` to `bytes` (never shrinks). Waits for the stream first: queued work may still
// use the old buffer. Only ever called while building a graph.
void grow(DeviceBuffer& buffer, size_t bytes, CudaState& state) {
    if (bytes <= buffer.bytes()) return;
    state.synchronize();
    buffer = DeviceBuffer();  // free first: the old and new buffers need not coexist
    buffer = DeviceBuffer(bytes);
}

// Caches `built` for (dir, s) and grows the docs bias to fit it. (The workspace is found, or
// grown, by workspace_for at prepare or first execution.) A full cache drops its least recently
// used graph, after waiting for the stream: queued calls may still run that graph's plan.
AttentionGraph& insert_graph(CudaState& state, Direction dir, const AttentionShape& s,
                             std::unique_ptr<AttentionGraph> built) {
    CudaState::AttentionCache& cache = state.attention_cache();
    grow(cache.bias, bias_bytes(s), state);
    const GraphKey key = graph_key(dir, s);
    if (cache.graphs.full() && !cache.graphs.contains(key)) state.synchronize();
    return *cache.graphs.insert(key, std::move(built));
}

// The workspace `g` runs on: the lent memory when it fits, else the state's own buffer, grown
// (once, waiting for the stream) when too small.
void* workspace_for(CudaState& state, const AttentionGraph& g) {
    CudaState::AttentionCache& cache = state.attention_cache();
    const size_t need = size_t(g.workspace_bytes);
    if (need == 0) return cache.workspace.data();
    if (cache.lent != nullptr && need <= cache.lent_bytes) return cache.lent;
    grow(cache.workspace, need, state);
    return cache.workspace.data();
}

// The cached graph for (dir, shape), built (and the state's buffers grown) on first use.
AttentionGraph& graph_for(CudaState& state, Direction dir, const AttentionShape& s) {
    CudaState::AttentionCache& cache = state.attention_cache();
    if (std::unique_ptr<AttentionGraph>* cached = cache.graphs.find(graph_key(dir, s)))
        return **cached;
    return insert_graph(state, dir, s, build_graph(cache.handle, dir, s));
}

// The forward graph of a shape with Tkv (forward only), or null when cuDNN declines the shape (the
// decline is cached too, as a null entry, so it is asked once per shape).
AttentionGraph* cache_form_graph(CudaState& state, const AttentionShape& s) {
    CudaState::AttentionCache& cache = state.attention_cache();
    const GraphKey key = graph_key(Direction::kForward, s);
    if (std::unique_ptr<AttentionGraph>* cached = cache.graphs.find(key)) return cached->get();
    std::unique_ptr<AttentionGraph> built =
        build_graph(cache.handle, Direction::kForward, s, /*may_decline=*/true);
    if (built != nullptr) return &insert_graph(state, Direction::kForward, s, std::move(built));
    if (cache.graphs.full()) state.synchronize();
    cache.graphs.insert(key, nullptr);
    return nullptr;
}

AttentionShape with_batch(AttentionShape s, int64_t B) {
    s.B = B;
    return s;
}

// How many batch rows one backward graph call takes (attention_backward_chunk_rows of the whole
// batch graph's workspace). Decided once per shape; the whole batch's graph is kept only when it
// is the one used.
int64_t backward_chunk(CudaState& state, const AttentionShape& s) {
    CudaState::AttentionCache& cache = state.attention_cache();
    const GraphKey key = chunk_key(s);
    if (const int64_t* cached = cache.backward_chunks.find(key)) return *cached;
    int64_t chunk = s.B;
    if (s.backward_workspace_cap > 0 &&
        !cache.graphs.contains(graph_key(Direction::kBackward, s))) {
        std::unique_ptr<AttentionGraph> whole = build_graph(cache.handle, Direction::kBackward, s);
        chunk = attention_backward_chunk_rows(s.B, size_t(whole->workspace_bytes),
                                              s.backward_workspace_cap);
        if (chunk == s.B) insert_graph(state, Direction::kBackward, s, std::move(whole));
    }
    cache.backward_chunks.insert(key, chunk);
    return chunk;
}

void check_shape(const AttentionShape& s, const char* op) {
    LATHE_CHECK(s.B > 0 && s.T > 0 && s.H > 0 && s.Hkv > 0 && s.D > 0 && s.H % s.Hkv == 0,
                "{}: B={} T={} H={} Hkv={} D={}", op, s.B, s.T, s.H, s.Hkv, s.D);
    LATHE_CHECK(s.D <= 128 && s.D % 8 == 0,
                "{}: head dim D = {}; cuDNN's flash attention takes D <= 128, a multiple of 8", op,
                s.D);
    LATHE_CHECK(s.window >= 0, "{}: window {} (0 means none)", op, s.window);
    LATHE_CHECK(s.Tkv == 0 || (s.Tkv >= s.T && kv_rows(s) >= s.Tkv && !s.docs),
                "{}: T={} Tkv={} kv_rows={} docs={}; the cache form takes T <= Tkv <= kv_rows and "
                "no docs",
                op, s.T, s.Tkv, s.kv_rows, s.docs);
    LATHE_CHECK(s.qkv_heads == 0 || (s.qkv_heads == s.H + 2 * s.Hkv && s.Tkv == 0),
                "{}: qkv_heads {} with H={} Hkv={} Tkv={}; a packed q, k, v buffer holds H + 2 Hkv "
                "heads a row, in the training form",
                op, s.qkv_heads, s.H, s.Hkv, s.Tkv);
}

void check_call(CudaState& state, CUstream_st* stream, const AttentionShape& s, const int32_t* docs,
                const char* op) {
    check_shape(s, op);
    LATHE_CHECK((docs != nullptr) == s.docs, "{}: docs pointer {} but shape.docs = {}", op,
                docs != nullptr ? "given" : "null", s.docs);
    LATHE_CHECK(stream == state.stream(), "{}: not on the CudaState's stream", op);
}

// bias[b, t, j] = 0 when docs[b, j] == docs[b, t], else -1e9: exp(-1e9 + score - max) is exactly 0
// in fp32, and the value stays finite, so a tile of keys from other documents never turns the
// online softmax's running maximum into -inf - (-inf). One block per (b, t) row, 8 keys per thread
// per step (one 16-byte store) when T allows.
template <int kVec>
__global__ void docs_bias_kernel(__nv_bfloat16* __restrict__ bias, const int32_t* __restrict__ docs,
                                 int64_t T) {
    const int64_t row = blockIdx.x;  // b * T + t
    const int64_t b = row / T;
    const int32_t mine = docs[row];
    const int32_t* drow = docs + b * T;
    __nv_bfloat16* out = bias + row * T;
    const __nv_bfloat16 zero = __float2bfloat16(0.0f), masked = __float2bfloat16(-1e9f);
    for (int64_t j = int64_t(threadIdx.x) * kVec; j < T; j += int64_t(blockDim.x) * kVec) {
        if constexpr (kVec == 8) {
            alignas(16) __nv_bfloat16 v[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = drow[j + i] == mine ? zero : masked;
            *reinterpret_cast<uint4*>(out + j) = *reinterpret_cast<const uint4*>(v);
        } else {
            out[j] = drow[j] == mine ? zero : masked;
        }
    }
}

void write_docs_bias(void* bias, const int32_t* docs, const AttentionShape& s,
                     CUstream_st* stream) {
    const unsigned rows = unsigned(s.B * s.T);
    auto* out = static_cast<__nv_bfloat16*>(bias);
    if (s.T % 8 == 0)
        docs_bias_kernel<8><<<rows, 128, 0, stream>>>(out, docs, s.T);
    else
        docs_bias_kernel<1><<<rows, 128, 0, stream>>>(out, docs, s.T);
    LATHE_CUDA_CHECK_LAUNCH();
}

void execute(CudaState& state, AttentionGraph& g, Direction dir, const AttentionShape& s) {
    CudaState::AttentionCache& cache = state.attention_cache();
    void* workspace = workspace_for(state, g);
    const fe::error_t status = g.graph->execute(cache.handle, g.pack, workspace);
    expect_ok(status, "execute", dir, s);
}

void set(AttentionGraph& g, Uid uid, const void* ptr) {
    g.pack.at(uid) = const_cast<void*>(ptr);  // cuDNN's pack is untyped; inputs are only read
}

}  // namespace

const char* attention_unavailable_reason() {
    return nullptr;
}

int64_t attention_cudnn_version() {
    return int64_t(cudnnGetVersion());
}

size_t attention_prepare(CudaState& state, const AttentionShape& shape) {
    check_shape(shape, "attention_prepare");
    if (shape.Tkv > 0) {  // forward only; nothing when cuDNN declines (the kernel runs)
        const AttentionGraph* fwd = cache_form_graph(state, shape);
        if (fwd == nullptr) return 0;
        workspace_for(state, *fwd);
        return size_t(fwd->workspace_bytes);
    }
    const AttentionGraph& fwd = graph_for(state, Direction::kForward, shape);
    const AttentionGraph& bwd =
        graph_for(state, Direction::kBackward, with_batch(shape, backward_chunk(state, shape)));
    workspace_for(state, fwd);  // grown now (unless lent memory fits), not at the first call
    workspace_for(state, bwd);
    return size_t(std::max(fwd.workspace_bytes, bwd.workspace_bytes)) + bias_bytes(shape);
}

size_t attention_workspace_bytes(CudaState& state, const AttentionShape& shape) {
    check_shape(shape, "attention_workspace_bytes");
    if (shape.Tkv > 0) {
        const AttentionGraph* fwd = cache_form_graph(state, shape);
        return fwd == nullptr ? 0 : size_t(fwd->workspace_bytes);
    }
    const AttentionGraph& fwd = graph_for(state, Direction::kForward, shape);
    const AttentionGraph& bwd =
        graph_for(state, Direction::kBackward, with_batch(shape, backward_chunk(state, shape)));
    return size_t(std::max(fwd.workspace_bytes, bwd.workspace_bytes));
}

bool attention_cudnn_takes(CudaState& state, const AttentionShape& shape) {
    check_shape(shape, "attention_cudnn_takes");
    if (shape.Tkv > 0) return cache_form_graph(state, shape) != nullptr;
    graph_for(state, Direction::kForward, shape);
    return true;
}

void attention_lend_workspace(CudaState& state, void* ptr, size_t bytes) {
    LATHE_CHECK(reinterpret_cast<uintptr_t>(ptr) % 256 == 0,
                "attention_lend_workspace: {} is not 256-byte aligned", ptr);
    CudaState::AttentionCache& cache = state.attention_cache();
    cache.lent = bytes > 0 ? ptr : nullptr;
    cache.lent_bytes = bytes > 0 ? bytes : 0;
}

void attention_end_loan(CudaState& state, const void* ptr) {
    CudaState::AttentionCache& cache = state.attention_cache();
    if (cache.lent != ptr || ptr == nullptr) return;
    state.synchronize();  // queued attention calls may still run on it
    cache.lent = nullptr;
    cache.lent_bytes = 0;
}

size_t attention_buffer_bytes(const CudaState& state) {
    const CudaState::AttentionCache* cache = state.attention_cache_if_created();
    return cache == nullptr ? 0 : cache->workspace.bytes() + cache->bias.bytes();
}

void attention_limit_graphs(CudaState& state, size_t limit) {
    LATHE_CHECK(limit >= 4, "attention_limit_graphs: {} graphs; a call holds up to 3, so >= 4",
                limit);
    CudaState::AttentionCache& cache = state.attention_cache();
    if (cache.graphs.size() > limit) state.synchronize();  // queued calls may run evicted plans
    cache.graphs.set_capacity(limit);
    cache.backward_chunks.set_capacity(limit);
}

size_t attention_graph_count(const CudaState& state) {
    const CudaState::AttentionCache* cache = state.attention_cache_if_created();
    return cache == nullptr ? 0 : cache->graphs.size();
}

size_t attention_graph_evictions(const CudaState& state) {
    const CudaState::AttentionCache* cache = state.attention_cache_if_created();
    return cache == nullptr ? 0 : cache->graphs.evictions();
}

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const int32_t* docs, const AttentionShape& shape, CudaState& state,
                       CUstream_st* stream) {
    check_call(state, stream, shape, docs, "attention_forward");
    AttentionGraph* cached = nullptr;
    if (shape.Tkv > 0) {
        cached = cache_form_graph(state, shape);
        if (cached == nullptr) {  // cuDNN declined this shape: lathe's kernel
            const AttentionRowsShape rows{shape.B,    shape.T, kv_rows(shape),      shape.H,
                                          shape.Hkv,  shape.D, shape.Tkv - shape.T, shape.window,
                                          shape.scale};
            attention_forward_rows(out, lse, q, k, v, nullptr, nullptr, rows, state, stream);
            return;
        }
    }
    AttentionGraph& g = cached != nullptr ? *cached : graph_for(state, Direction::kForward, shape);
    set(g, kQ, q);
    set(g, kK, k);
    set(g, kV, v);
    set(g, kO, out);
    set(g, kStats, lse);
    if (shape.docs) {
        void* bias = state.attention_cache().bias.data();
        write_docs_bias(bias, docs, shape, stream);
        set(g, kBias, bias);
    }
    execute(state, g, Direction::kForward, shape);
}

void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                        const bf16* k, const bf16* v, const bf16* out, const float* lse,
                        const int32_t* docs, const AttentionShape& shape, CudaState& state,
                        CUstream_st* stream) {
    check_call(state, stream, shape, docs, "attention_backward");
    LATHE_CHECK(shape.Tkv == 0 && shape.kv_rows == 0,
                "attention_backward: Tkv={} kv_rows={}; the backward takes the training form only",
                shape.Tkv, shape.kv_rows);
    const int64_t chunk = backward_chunk(state, shape);
    const AttentionShape part = with_batch(shape, chunk);
    AttentionGraph& g = graph_for(state, Direction::kBackward, part);
    // Batch rows are contiguous in every tensor: chunk i is plain pointer offsets.
    const int64_t o_rows = chunk * shape.T * shape.H * shape.D;
    const int64_t q_rows = chunk * shape.T * stored_heads(shape, shape.H) * shape.D;
    const int64_t kv_rows = chunk * shape.T * stored_heads(shape, shape.Hkv) * shape.D;
    const int64_t lse_rows = chunk * shape.H * shape.T;
    for (int64_t i = 0; i < shape.B / chunk; ++i) {
        set(g, kQ, q + i * q_rows);
        set(g, kK, k + i * kv_rows);
        set(g, kV, v + i * kv_rows);
        set(g, kO, out + i * o_rows);
        set(g, kDO, dout + i * o_rows);
        set(g, kStats, lse + i * lse_rows);
        set(g, kDQ, dq + i * q_rows);
        set(g, kDK, dk + i * kv_rows);
        set(g, kDV, dv + i * kv_rows);
        if (shape.docs) {
            void* bias = state.attention_cache().bias.data();
            write_docs_bias(bias, docs + i * chunk * shape.T, part, stream);
            set(g, kBias, bias);
        }
        execute(state, g, Direction::kBackward, part);
    }
}

}  // namespace cuda

#else  // !LATHE_HAVE_CUDNN_FRONTEND

// Built without the cuDNN frontend headers or libcudnn: the state and its accessors exist (the
// CudaState links the same either way), and every attention call stops with the reason.
struct CudaState::AttentionCache {};

void CudaState::AttentionCacheDeleter::operator()(AttentionCache* cache) const {
    delete cache;
}

CudaState::AttentionCache& CudaState::attention_cache() {
    if (attention_cache_ == nullptr) attention_cache_.reset(new AttentionCache);
    return *attention_cache_;
}

namespace cuda {

namespace {
[[noreturn]] void unavailable(const char* op) {
    LATHE_CHECK(false, "{}: {}", op, attention_unavailable_reason());
    __builtin_unreachable();
}
}  // namespace

const char* attention_unavailable_reason() {
    return "this build has no CUDA attention: it was configured without the cuDNN frontend "
           "headers or libcudnn (run scripts/install-deps.sh for the headers, install cuDNN 9, "
           "then re-run cmake; see docs/CUDA.md)";
}

int64_t attention_cudnn_version() {
    return 0;
}

size_t attention_prepare(CudaState&, const AttentionShape&) {
    unavailable("attention_prepare");
}

size_t attention_buffer_bytes(const CudaState&) {
    return 0;
}

void attention_limit_graphs(CudaState&, size_t) {}

size_t attention_graph_count(const CudaState&) {
    return 0;
}

size_t attention_graph_evictions(const CudaState&) {
    return 0;
}

size_t attention_workspace_bytes(CudaState&, const AttentionShape&) {
    unavailable("attention_workspace_bytes");
}

bool attention_cudnn_takes(CudaState&, const AttentionShape&) {
    return false;
}

void attention_lend_workspace(CudaState&, void*, size_t) {}

void attention_end_loan(CudaState&, const void*) {}

void attention_forward(bf16*, float*, const bf16*, const bf16*, const bf16*, const int32_t*,
                       const AttentionShape&, CudaState&, CUstream_st*) {
    unavailable("attention_forward");
}

void attention_backward(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                        const bf16*, const float*, const int32_t*, const AttentionShape&,
                        CudaState&, CUstream_st*) {
    unavailable("attention_backward");
}

}  // namespace cuda

#endif  // LATHE_HAVE_CUDNN_FRONTEND

}  // namespace lathe
