#include "ops/argmax.h"

#include <limits>

#include "ops/op_test.h"

namespace lathe::optest {
namespace {

// The rule of infer/sampling.h's temperature 0: the lowest index of the largest value, NaN as
// -inf, a row of only -inf and NaN giving 0.
TEST(Argmax, LowestIndexOfTheLargestNanAsMinusInfinity) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    HostTensor x = tensor_of(Shape{5, 4}, {
                                              1.0f,  3.0f,  2.0f,  3.0f,   // tie: 1
                                              nan,   0.5f,  nan,   0.25f,  // NaN below all: 1
                                              -inf,  nan,   -inf,  nan,    // nothing finite: 0
                                              -2.0f, -1.0f, -3.0f, inf,    // +inf: 3
                                              7.0f,  7.0f,  7.0f,  7.0f,   // all equal: 0
                                          });
    HostTensor ids(DType::kI32, {5});
    argmax_rows(ids.view(), x.view(), cpu_context());
    const int32_t want[] = {1, 1, 0, 3, 0};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(ids.as<int32_t>()[i], want[i]) << "row " << i;
}

}  // namespace
}  // namespace lathe::optest
