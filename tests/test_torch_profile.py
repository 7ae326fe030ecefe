"""bench/torch_profile.py, torch.compile's step time by kernel group (run on the GPU machine for
docs/PERF.md), kept working off it: its --help, its errors (torch_baseline.py not found, bad
counts), and the grouping of the kernel names PyTorch's profiler reported on an H200.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "torch_profile.py"
sys.path.insert(0, str(SCRIPT.parent))

import torch_profile  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_help_names_the_shapes():
    p = run(SCRIPT, "--help")
    assert p.returncode == 0, p.stderr
    for shape in ("gpt2", "llama1b", "llama8b"):
        assert shape in p.stdout


def test_a_missing_torch_baseline_is_an_error(tmp_path):
    p = run(SCRIPT, "gpt2", "--torch-baseline-dir", tmp_path)
    assert p.returncode != 0
    assert f"torch_baseline.py not found in {tmp_path}" in p.stderr
    assert "Traceback" not in p.stderr


def test_bad_counts_are_refused():
    p = run(SCRIPT, "gpt2", "--steps", "0")
    assert p.returncode == 2
    assert "--steps must be >= 1" in p.stderr


def test_kernel_names_fall_in_lathes_groups():
    # Names from the H200 run of docs/PERF.md (torch 2.x, cuDNN 9, inductor's Triton kernels).
    cases = {
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>": "gemm",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64": "attention",
        "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*)": "attention",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
        "FusedOptimizerTensorListMetadata<4>>": "optimizer",
        "triton_red_fused__log_softmax__to_copy__unsafe_view_prepare_softmax_online_view_17":
            "lm_head_ce",
        "triton_per_fused__to_copy_add_native_layer_norm_backward_view_9": "norms",
        "triton_red_fused__fused_rms_norm__to_copy__unsafe_view_add_13": "norms",
        "triton_poi_fused_gelu_gelu_backward_view_6": "elementwise",
        "triton_poi_fused__unsafe_view_cat_mul_silu_silu_backward_split_view_4": "elementwise",
        "Memset (Device)": "copies",
        "some_kernel_of_its_own": "other",
    }
    for name, group in cases.items():
        assert torch_profile.group_of(name) == group, name
