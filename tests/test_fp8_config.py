"""The fp8.* keys of lathe train: each bad value stops before any work, naming the key, the value
and what to choose (run/train_settings.cpp through model/fp8_state.h's fp8_settings_parse)."""

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
