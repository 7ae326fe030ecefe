// dist/peer_all_reduce.h in a build without CUDA (the real one is peer_all_reduce.cu): no GPU
// buffers to reduce, so open() says why and returns null, and nothing can call sum().

#include "dist/peer_all_reduce.h"

#if !LATHE_HAVE_CUDA

#include "core/check.h"

namespace lathe {

Result<std::unique_ptr<PeerAllReduce>> PeerAllReduce::open(Communicator&, int64_t, CUstream_st*,
                                                           std::string* why_not) {
    LATHE_CHECK(why_not != nullptr);
    *why_not = "this lathe was built without CUDA";
    return std::unique_ptr<PeerAllReduce>();
}

PeerAllReduce::~PeerAllReduce() = default;

bool PeerAllReduce::fits(ConstTensorView) const {
    return false;
}

void PeerAllReduce::sum(TensorView, CUstream_st*) {
    LATHE_CHECK(false, "peer all-reduce in a build without CUDA");
}

}  // namespace lathe

#endif
