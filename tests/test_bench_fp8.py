"""`lathe bench --precision fp8` where no FP8 GPU is needed (run/bench.h): the CPU backend is an
error naming it (never a fallback to bf16); --fp8-recipe alone is refused; the CUDA plan (--plan-only, no GPU needed) gains the fp8
buffers' row, and the line keeps the bf16 line's fields plus precision and fp8_recipe. The runs
themselves (fp8_gemms_per_step, fp8_weight_casts_per_step) are the GPU's: scripts/gpu-check.sh."""
import json
import os
import subprocess

LATHE = os.environ.get("LATHE_BIN", "build/lathe")
TINY = ["--model", "tiny", "--batch", "2", "--seq", "16", "--steps", "1", "--warmup", "0",
        "--threads", "1"]


def bench(*args):
    return subprocess.run([LATHE, "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_fp8_on_the_cpu_backend_is_an_error_naming_it():
    p = bench(*TINY, "--device", "cpu", "--precision", "fp8")
    assert p.returncode != 0 and p.stdout == ""
    assert "lathe: error: --precision fp8: the bench computes on cpu" in p.stderr, p.stderr
    assert "the cpu backend, which has no fp8 linear" in p.stderr, p.stderr


def test_fp8_recipe_without_fp8_is_refused():
    p = bench(*TINY, "--device", "cpu", "--fp8-recipe", "delayed")
    assert p.returncode != 0
    assert "--fp8-recipe delayed without --precision fp8" in p.stderr, p.stderr


def test_fp8_plan_adds_the_buffers_row_and_keeps_the_fields():
    lines = {}
    for precision, recipe in [("bf16", None), ("fp8", "tensorwise"), ("fp8", "delayed"),
                              ("fp8", "blockwise")]:
        args = [*TINY, "--device", "cuda", "--plan-only", "--precision", precision]
        if recipe:
            args += ["--fp8-recipe", recipe]
        p = bench(*args)
        assert p.returncode == 0, p.stderr
        lines[recipe or precision] = (json.loads(p.stdout), p.stderr)
    bf16, bf16_table = lines["bf16"]
    assert bf16["precision"] == "bf16" and "fp8_recipe" not in bf16
    assert bf16["plan"]["fp8_buffers"] == 0 and "fp8" not in bf16_table
    for recipe in ("tensorwise", "delayed", "blockwise"):
        j, table = lines[recipe]
        assert j["precision"] == "fp8" and j["fp8_recipe"] == recipe
        assert set(bf16) <= set(j) and set(j) - set(bf16) == {"fp8_recipe"}
        # tiny: 2 layers x 4 linears (q, k, v stacked); each (O, I) weight twice (codes and transpose) at a byte.
        assert j["plan"]["fp8_buffers"] > 0
        assert j["plan_bytes"] == bf16["plan_bytes"] + j["plan"]["fp8_buffers"]
        assert "fp8 buffers (codes, scales)" in table and f"8 linears ({recipe})" in table
    # Delayed scaling adds a scale and an amax per scaled tensor (3 per linear) to tensorwise's.
    assert lines["delayed"][0]["plan"]["fp8_buffers"] > lines["tensorwise"][0]["plan"]["fp8_buffers"]


def test_fp8_lm_head_adds_the_heads_codes_to_the_plan():
    """--fp8-lm-head (fp8.lm_head: true): the head counts as one more fp8 linear, its weight's
    codes and transpose (V x C bytes each) join the fp8 buffers; refused without --precision fp8
    and, naming the keys, with the blockwise recipe."""
    base = [*TINY, "--device", "cuda", "--plan-only", "--precision", "fp8"]
    layers = bench(*base)
    head = bench(*base, "--fp8-lm-head")
    assert layers.returncode == 0 and head.returncode == 0, head.stderr
    jl, jh = json.loads(layers.stdout), json.loads(head.stdout)
    assert "fp8_lm_head" not in jl and jh["fp8_lm_head"] is True
    assert jh["plan"]["fp8_buffers"] >= jl["plan"]["fp8_buffers"] + 2 * 512 * 64  # tiny: V 512, C 64
    assert "9 linears (tensorwise)" in head.stderr, head.stderr
    p = bench(*TINY, "--device", "cpu", "--fp8-lm-head")
    assert p.returncode != 0 and "--fp8-lm-head without --precision fp8" in p.stderr, p.stderr
    p = bench(*base, "--fp8-recipe", "blockwise", "--fp8-lm-head")
    assert p.returncode != 0
    assert "fp8.lm_head: true with fp8.recipe: blockwise" in p.stderr, p.stderr


def test_lm_head_rows_sets_the_heads_chunk():
    """--lm-head-rows sets the LM head's chunk of logit rows (the line's lm_head_rows); 0 takes the
    plan's budget, at the 8B slice's vocabulary 1,046 rows in bf16 and 4,192 with the head in fp8
    (four times the bytes, model/memory_plan.h); fewer rows plan fewer bytes; a negative count and
    --generate are refused naming the option."""
    base = ["--model", "llama3-8b-8l", "--batch", "2", "--seq", "4096", "--device", "cuda",
            "--plan-only", "--state-dtype", "bf16"]
    fp8 = ["--precision", "fp8", "--fp8-lm-head"]
    rows = {}
    for name, extra in [("bf16", []), ("fp8", fp8), ("fp8_1056", fp8 + ["--lm-head-rows", 1056]),
                        ("bf16_2000", ["--lm-head-rows", 2000])]:
        p = bench(*base, *extra)
        assert p.returncode == 0, p.stderr
        rows[name] = json.loads(p.stdout)
    assert rows["bf16"]["lm_head_rows"] == (512 << 20) // (128256 * 4) == 1046
    assert rows["fp8"]["lm_head_rows"] == 4192  # (2 << 30) // (128256 * 4) = 4186, to 16
    assert rows["fp8_1056"]["lm_head_rows"] == 1056
    assert rows["bf16_2000"]["lm_head_rows"] == 2000
    assert rows["fp8_1056"]["plan_bytes"] < rows["fp8"]["plan_bytes"]
    assert "LM-head chunk 4192 rows" in bench(*base, *fp8).stderr
    p = bench(*base, "--lm-head-rows", -1)
    assert p.returncode != 0 and "--lm-head-rows" in p.stderr, p.stderr
    p = bench("--generate", "--model", "tiny", "--device", "cpu", "--lm-head-rows", 16)
    assert p.returncode != 0 and "--lm-head-rows is a training bench option" in p.stderr, p.stderr
