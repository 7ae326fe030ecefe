"""lathe's FP8 formats (core/dtype.h) against torch.float8_e4m3fn and torch.float8_e5m2, bit for bit.

torch generates the inputs and the expected codes; the ops_tests binary's
Fp8FormatInterop.DISABLED_EncodeDecodeForPython encodes the same f32 values with lathe's
conversions and decodes every code (src/ops/fp8_format_test.cpp says what it writes).

torch's conversions, which the test pins down as it checks them:
  .to(float8_e4m3fn) saturates (beyond 448, infinities included, gives +-448): lathe's kSaturate;
  .to(float8_e5m2) does not (beyond 57344 rounds to +-inf): lathe's kNoSaturate;
  torchao's saturated cast, clamp(-max, max) then .to(), is lathe's kSaturate for both formats.
NaN inputs give the NaN code S.1111111 of their sign in both formats.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("LATHE_BUILD_DIR", REPO / "build"))
OPS_TESTS = BUILD_DIR / "ops_tests"

FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def codes_of(x, fmt):
    """torch's code for every f32 in x (a 1-D float32 tensor)."""
    return x.to(FORMATS[fmt][0]).view(torch.uint8)


def decoded_codes(fmt):
    """The f32 value of each of the 256 codes, by torch."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FORMATS[fmt][0]).float()


def make_inputs():
    """The f32 values the comparison runs on, with a name for each group (for messages)."""
    groups = {}
    # Every bf16 bit pattern (the input of the cast kernels): NaNs, infinities, subnormals.
    groups["every bf16"] = (torch.arange(65536, dtype=torch.int32) << 16).view(torch.float32)
    for fmt in FORMATS:
        v = decoded_codes(fmt)
        v = v[torch.isfinite(v)]
        groups[f"every {fmt} code"] = v
        pos = torch.unique(v[v >= 0])  # ascending, +0 to the largest finite
        lo, hi = pos[:-1], pos[1:]
        mid = (lo + hi) * 0.5  # exact in f32: the ties
        groups[f"{fmt} midpoints"] = torch.cat([mid, -mid])
        above = torch.nextafter(mid, hi)
        below = torch.nextafter(mid, lo)
        groups[f"{fmt} around midpoints"] = torch.cat([above, below, -above, -below])
        top = pos[-1].item()
        step = (pos[-1] - pos[-2]).item()
        edge = torch.tensor([top, top + step / 2, top + step, 2 * top, 1e30, 3.4e38], dtype=torch.float32)
        edge = torch.cat([edge, torch.nextafter(edge, torch.zeros_like(edge)),
                          torch.nextafter(edge, torch.full_like(edge, float("inf")))])
        groups[f"{fmt} overflow edge"] = torch.cat([edge, -edge])
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan")])
    nan_payloads = torch.tensor([0x7F800001, 0x7FC00001, 0x7FFFFFFF, -1, -0x00400000 - 1],
                                dtype=torch.int32).view(torch.float32)
    groups["specials"] = torch.cat([special, nan_payloads])
    g = torch.Generator().manual_seed(1234)
    # Random bit patterns over all of f32 (about 0.4 % NaN, f32 subnormals, huge values).
    groups["random bits"] = torch.randint(-2**31, 2**31, (1 << 20,), generator=g, dtype=torch.int64) \
        .to(torch.int32).view(torch.float32)
    # Random values in and around each format's range, and around its subnormals.
    exps = torch.randint(-24, 20, (1 << 20,), generator=g).float()
    groups["random scaled"] = torch.randn(1 << 20, generator=g) * torch.exp2(exps)
    return groups


@pytest.fixture(scope="module")
def lathe_codes(tmp_path_factory):
    assert OPS_TESTS.exists(), f"{OPS_TESTS} is missing: build the ops_tests target"
    groups = make_inputs()
    names = list(groups)
    x = torch.cat([groups[k].reshape(-1) for k in names]).contiguous()
    d = tmp_path_factory.mktemp("fp8")
    (d / "in.f32").write_bytes(x.numpy().astype("<f4").tobytes())
    proc = subprocess.run(
        [str(OPS_TESTS), "--gtest_also_run_disabled_tests",
         "--gtest_filter=Fp8FormatInterop.DISABLED_EncodeDecodeForPython"],
        env={**os.environ, "LATHE_FP8_IN": str(d / "in.f32"), "LATHE_FP8_OUT": str(d / "out.bin")},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[  PASSED  ] 1 test" in proc.stdout, proc.stdout
    raw = (d / "out.bin").read_bytes()
    n = x.numel()
    assert len(raw) == 4 * n + 512 * 4
    codes = torch.from_numpy(np.frombuffer(raw[:4 * n], dtype=np.uint8).reshape(n, 4).copy())
    decoded = torch.from_numpy(np.frombuffer(raw[4 * n:], dtype="<f4").copy())
    group_of = np.repeat(np.arange(len(names)), [groups[k].numel() for k in names])
    return x, codes, decoded, names, group_of


def assert_same_codes(x, got, want, what, names, group_of):
    bad = (got != want).nonzero().reshape(-1)
    if bad.numel():
        lines = [f"{what}: {bad.numel()} of {x.numel()} inputs differ from torch; first ones:"]
        for i in bad[:12].tolist():
            bits = x[i:i + 1].view(torch.int32).item() & 0xFFFFFFFF
            lines.append(f"  {x[i].item()!r} (0x{bits:08x}, {names[group_of[i]]}): "
                         f"lathe 0x{got[i].item():02x}, torch 0x{want[i].item():02x}")
        pytest.fail("\n".join(lines))


def test_input_set_covers_the_cases(lathe_codes):
    x = lathe_codes[0]
    assert torch.isnan(x).sum() > 1000
    assert torch.isinf(x).sum() >= 4
    assert ((x != 0) & (x.abs() < 2**-126)).sum() > 1000  # f32 subnormals
    assert ((x.abs() > 0) & (x.abs() < 2**-9)).sum() > 10000  # below e4m3's smallest subnormal
    assert (x.abs() > 57344).sum() > 1000


def test_e4m3_encode_matches_torch(lathe_codes):
    x, codes, _, names, group_of = lathe_codes
    # torch's e4m3fn cast saturates: lathe's kSaturate.
    assert_same_codes(x, codes[:, 0], codes_of(x, "e4m3"), "e4m3 (saturating) vs .to(float8_e4m3fn)",
                      names, group_of)


def test_e5m2_encode_matches_torch(lathe_codes):
    x, codes, _, names, group_of = lathe_codes
    assert_same_codes(x, codes[:, 3], codes_of(x, "e5m2"), "e5m2 (not saturating) vs .to(float8_e5m2)",
                      names, group_of)


@pytest.mark.parametrize("fmt,column", [("e4m3", 0), ("e5m2", 2)])
def test_saturating_encode_matches_clamp_then_cast(lathe_codes, fmt, column):
    x, codes, _, names, group_of = lathe_codes
    top = FORMATS[fmt][1]
    assert_same_codes(x, codes[:, column], codes_of(x.clamp(-top, top), fmt),
                      f"{fmt} (saturating) vs clamp then cast", names, group_of)


def test_e4m3_without_saturation_is_nan_beyond_the_range(lathe_codes):
    # torch has no non-saturating e4m3 cast: where torch's rounds within the range lathe's
    # kNoSaturate code is the same, and it is the NaN of the sign exactly where the rounded value
    # leaves the range (|x| > 464, the midpoint between 448 and the next step 480) or x is infinite.
    x, codes, _, names, group_of = lathe_codes
    finite = ~torch.isnan(x)
    beyond = finite & (x.abs() > 464)
    want = codes_of(x, "e4m3").clone()
    want[beyond] = torch.where(x[beyond] < 0, 0xFF, 0x7F).to(torch.uint8)
    assert beyond.sum() > 1000
    assert_same_codes(x, codes[:, 1], want, "e4m3 (not saturating)", names, group_of)


@pytest.mark.parametrize("fmt,offset", [("e4m3", 0), ("e5m2", 256)])
def test_decode_matches_torch_on_every_code(lathe_codes, fmt, offset):
    decoded = lathe_codes[2][offset:offset + 256]
    want = decoded_codes(fmt)
    for c in range(256):
        w, g = want[c].item(), decoded[c].item()
        # Bit for bit: signed zeros, infinities and the NaN's f32 pattern included.
        gb = decoded[c:c + 1].view(torch.int32).item() & 0xFFFFFFFF
        wb = want[c:c + 1].view(torch.int32).item() & 0xFFFFFFFF
        assert gb == wb, f"{fmt} code 0x{c:02x}: lathe {g!r} (0x{gb:08x}), torch {w!r} (0x{wb:08x})"
