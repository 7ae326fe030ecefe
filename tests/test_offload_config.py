"""The optimizer offload keys of lathe train (run/train_settings.cpp): optimizer.offload,
optimizer.offload_fraction and optimizer.state_dtype parse and validate, a bad value stops before
any work naming the key and what to choose, and a valid setting lathe train does not run (bf16
moments without offload) stops the run with an error naming the key, never ignored; offload: cpu
trains at any fraction (tests/test_offload_train.py). Unset, the keys stay out of
the run's config.yaml."""

import pytest

from lathe_cli import TINY_MODEL_2L, run, tiny_training_folder, train_cmd

TINY = TINY_MODEL_2L + """train:
  steps: 1
  micro_batch_size: 2
  threads: 2
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_training_folder(tmp_path_factory.mktemp("offload_corpus"), TINY, 100_000)


@pytest.mark.parametrize("sets,needle", [
    (["optimizer.offload=gpu"], "'optimizer.offload' is 'gpu'; choose none or cpu"),
    (["optimizer.offload=cpu", "optimizer.offload_fraction=0"],
     "'optimizer.offload_fraction' must be in (0, 1]"),
    (["optimizer.offload_fraction=1.5"], "'optimizer.offload_fraction' must be in (0, 1]"),
    (["optimizer.offload_fraction=-0.25"], "got -0.25"),
    (["optimizer.state_dtype=fp16"], "'optimizer.state_dtype' is 'fp16'; choose fp32 or bf16"),
    (["optimizer.offload_fraction=half"], "optimizer.offload_fraction"),
    (["optimizer.offload_schedule=eager"],
     "'optimizer.offload_schedule' is 'eager'; choose overlapped, serial or delayed"),
    (["optimizer.offload=cpu", "optimizer.offload_schedule=delayed",
      "optimizer.offload_fraction=0.5"],
     "'optimizer.offload_schedule: delayed' runs every optimizer update on the host"),
    (["optimizer.offload_schedule=delayed"],
     "'optimizer.offload_schedule' orders the host optimizer's steps, which runs with "
     "optimizer.offload: cpu only"),
])
def test_bad_offload_keys_fail_before_work_naming_the_key(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "bad", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


@pytest.mark.parametrize("sets,needle", [
    (["optimizer.offload_fraction=0.5"], "'optimizer.offload_fraction' 0.5 offloads part"),
])
def test_valid_offload_is_refused_at_train_start_naming_the_key(corpus, tmp_path, sets, needle):
    p = run(train_cmd(corpus, tmp_path / "off", *sets), check=False)
    assert p.returncode != 0
    assert "lathe: error:" in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert "Optimizer offload" in p.stderr, p.stderr  # points at docs/SFT.md
    assert not (tmp_path / "off" / "checkpoints").exists()


def test_the_refusal_comes_after_every_other_check(corpus, tmp_path):
    """A bad key elsewhere is reported first: a refused offload setting does not hide it."""
    p = run(train_cmd(corpus, tmp_path / "both", "optimizer.offload_fraction=0.5",
                      "optimizer.eps=0"), check=False)
    assert p.returncode != 0
    assert "'optimizer.eps' must be > 0" in p.stderr, p.stderr


def test_default_keys_train_and_stay_out_of_config_yaml(corpus, tmp_path):
    """offload none, fraction 1 and fp32 moments are the defaults a run trains with; unset keys
    are not written into the run's config.yaml (existing runs keep their bytes), set ones are."""
    p = run(train_cmd(corpus, tmp_path / "plain"), check=False)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "plain" / "config.yaml").read_text()
    for key in ("offload:", "offload_fraction:", "offload_schedule:", "state_dtype:"):
        assert key not in text, text
    p = run(train_cmd(corpus, tmp_path / "explicit", "optimizer.offload=none",
                      "optimizer.offload_fraction=1", "optimizer.state_dtype=fp32"), check=False)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "explicit" / "config.yaml").read_text()
    assert "offload: none" in text and "offload_fraction: 1" in text, text
    assert "state_dtype: fp32" in text, text
