"""The fp8.* keys of lathe train: each bad value stops before any work, naming the key, the value
and what to choose (run/train_settings.cpp through model/fp8_state.h's fp8_settings_parse); and
train.precision fp8 where it cannot run (the CPU backend, an LM head ops/linear has no fp8 GEMM
for, token counts cuBLASLt's FP8 GEMMs do not take) stops before step 1, naming the backend or
the key (run/trainer.cpp, model/model.h's model_check_fp8)."""

import shutil

import pytest

from corpus import write_gcide_jsonl
from lathe_cli import TINY_MODEL_2L, run, tokenize_corpus, train_cmd

TINY = TINY_MODEL_2L + """train:
  steps: 2
  micro_batch_size: 2
  threads: 2
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8_corpus")
    write_gcide_jsonl(d / "c.jsonl", 200_000)
    tokenize_corpus(d / "c.jsonl", d / "tok.json", d / "gc", 384)
    (d / "tiny.yaml").write_text(TINY + f"\ndata.path: {d / 'gc'}\ndata.tokenizer: {d / 'tok.json'}\n")
    return d


@pytest.mark.parametrize("sets,needle", [
    (["fp8.recipe=rowwise"], "'fp8.recipe' is 'rowwise'; choose tensorwise, delayed or blockwise"),
    (["fp8.grad_format=e3m4"], "'fp8.grad_format' is 'e3m4'; choose auto, e4m3 or e5m2"),
    (["fp8.recipe=blockwise", "fp8.grad_format=e5m2"], "set fp8.grad_format: e4m3"),
    (["fp8.recipe=delayed", "fp8.amax_history=0"], "'fp8.amax_history' is 0; choose 1 to 4096"),
    (["fp8.amax_reduction=mean"], "'fp8.amax_reduction' is 'mean'; choose max or most_recent"),
    (["fp8.lm_head=maybe"], "fp8.lm_head"),
])
def test_bad_fp8_keys_fail_before_work_naming_the_key(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "bad", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_valid_fp8_keys_are_accepted_with_bf16(corpus, tmp_path):
    """fp8.* keys that are valid do not stop a run that does not use them: the CPU run trains."""
    p = run(train_cmd(corpus, tmp_path / "ok", "train.precision=fp32", "fp8.recipe=delayed",
                      "fp8.grad_format=e4m3", "fp8.amax_history=32", "fp8.amax_reduction=most_recent",
                      "fp8.lm_head=true"), check=False)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ok" / "metrics.jsonl").exists()


@pytest.mark.parametrize("sets,needle", [
    (["fp8.lm_head=true"], "fp8.lm_head: true: the LM head's fused GEMMs"),
    (["data.seq_length=15"], "(micro-batch 2 x sequence length 15 = 30) must be a multiple of 16"),
])
def test_fp8_what_the_linears_cannot_run_stops_before_work(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "bad", "train.precision=fp8", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr and "'train.precision: fp8'" in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise"])
def test_fp8_on_the_cpu_backend_is_an_error_naming_it(corpus, tmp_path, recipe):
    """train.device auto falls back to the CPU here: fp8 never falls back with it."""
    p = run(train_cmd(corpus, tmp_path / "cpu", "train.precision=fp8", f"fp8.recipe={recipe}"),
            check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    assert "the cpu backend, which has no fp8 linear" in p.stderr, p.stderr
    assert not (tmp_path / "cpu" / "checkpoints").exists()
    assert not (tmp_path / "cpu" / "metrics.jsonl").exists()
