#include "ops/gemm_args.h"

#include <fmt/format.h>

#include "core/check.h"

namespace lathe {

std::string_view gemm_epilogue_name(GemmEpilogue e) {
    switch (e) {
        case GemmEpilogue::kNone:
            return "none";
        case GemmEpilogue::kBias:
            return "bias";
        case GemmEpilogue::kGeluAux:
            return "gelu_aux";
        case GemmEpilogue::kGeluAuxBias:
            return "gelu_aux_bias";
    }
    return "?";
}

std::string gemm_args_describe(const GemmArgs& g) {
    std::string s = fmt::format(
        "M={} N={} K={} A {} ({}, lda {}) x B {} ({}, ldb {}) -> D {} (ldd {})", g.M, g.N, g.K,
        dtype_name(g.a_dtype), g.trans_a ? "T" : "N", g.lda, dtype_name(g.b_dtype),
        g.trans_b ? "T" : "N", g.ldb, dtype_name(g.d_dtype), g.ldd);
    if (g.C != nullptr) s += fmt::format(", C {} (ldc {})", dtype_name(g.c_dtype), g.ldc);
    s += fmt::format(", alpha {} beta {}", g.alpha, g.beta);
    if (g.a_scale != nullptr || g.b_scale != nullptr || g.d_scale != nullptr) {
        s += ", scales";
        if (g.a_scale != nullptr) s += " a";
        if (g.b_scale != nullptr) s += " b";
        if (g.d_scale != nullptr) s += " d";
    }
    if (g.d_amax != nullptr) s += ", amax";
    s += fmt::format(", epilogue {}", gemm_epilogue_name(g.epilogue));
    if (gemm_epilogue_has_bias(g.epilogue))
        s += fmt::format(" (bias {})", dtype_name(g.bias_dtype));
    if (g.batch_count != 1) s += fmt::format(", batch {}", g.batch_count);
    return s;
}

void gemm_args_check(const GemmArgs& g, std::string_view backend) {
    LATHE_CHECK(g.M > 0 && g.N > 0 && g.K > 0 && g.batch_count > 0, "{} gemm: sizes in {}", backend,
                gemm_args_describe(g));
    LATHE_CHECK(g.A != nullptr && g.B != nullptr && g.D != nullptr, "{} gemm: a null operand in {}",
                backend, gemm_args_describe(g));
    LATHE_CHECK(
        g.lda >= (g.trans_a ? g.M : g.K) && g.ldb >= (g.trans_b ? g.K : g.N) && g.ldd >= g.N,
        "{} gemm: row strides too small for the stored rows in {}", backend, gemm_args_describe(g));
    LATHE_CHECK(g.C == nullptr || (g.C != g.D && g.ldc >= g.N),
                "{} gemm: C must be another buffer than D with ldc >= N in {}", backend,
                gemm_args_describe(g));
    const bool bias = gemm_epilogue_has_bias(g.epilogue), gelu = gemm_epilogue_has_gelu(g.epilogue);
    LATHE_CHECK((g.bias != nullptr) == bias, "{} gemm: a bias {} epilogue {} in {}", backend,
                g.bias != nullptr ? "given to" : "missing for", gemm_epilogue_name(g.epilogue),
                gemm_args_describe(g));
    LATHE_CHECK((g.aux != nullptr) == gelu && (!gelu || g.ldaux >= g.N),
                "{} gemm: aux (ldaux {}) does not fit epilogue {} in {}", backend, g.ldaux,
                gemm_epilogue_name(g.epilogue), gemm_args_describe(g));
    LATHE_CHECK(g.batch_count == 1 || g.epilogue == GemmEpilogue::kNone,
                "{} gemm: an epilogue with more than one batch in {}", backend,
                gemm_args_describe(g));
    LATHE_CHECK(g.batch_count == 1 || (g.batch_stride_a >= 0 && g.batch_stride_b >= 0 &&
                                       g.batch_stride_c >= 0 && g.batch_stride_d >= g.M * g.ldd),
                "{} gemm: batch strides a {} b {} c {} d {} (d at least M * ldd) in {}", backend,
                g.batch_stride_a, g.batch_stride_b, g.batch_stride_c, g.batch_stride_d,
                gemm_args_describe(g));
}

}  // namespace lathe
