"""The tokenizer files a model folder carries: the trainer's checkpoints and `lathe convert` carry
the same set (kHfTokenizerFiles in run/special_tokens.h), byte for byte, from where they sit."""

from corpus import write_gcide_jsonl
from lathe_cli import TINY_MODEL, run


TINY = TINY_MODEL + """
train:
  steps: 2
  micro_batch_size: 2
  gradient_accumulation_steps: 1
  log_interval: 1
  threads: 2
optimizer:
  lr: 1.0e-3
checkpoint:
  interval: 2
"""

# Every file of the list besides tokenizer.json, with content that says which it is.
EXTRAS = {
    "special_tokens_map.json": '{"eos_token": "<|endoftext|>"}\n',
    "added_tokens.json": "{}\n",
    "chat_template.jinja": "{% for m in messages %}{{ m.content }}{% endfor %}\n",
    "chat_template.json": '{"chat_template": "{{ messages }}"}\n',
    "vocab.json": '{"a": 0}\n',
    "merges.txt": "#version: 0.2\n",
    "tokenizer.model": "not really sentencepiece\n",
    "generation_config.json": '{"do_sample": false}\n',
    "additional_chat_templates/tool_use.jinja": "{{ tools }}\n",
}


def test_checkpoint_and_convert_carry_the_same_tokenizer_files(tmp_path):
    write_gcide_jsonl(tmp_path / "c.jsonl", 200_000)
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    run(["tokenizer", "train", "--vocab-size", 300, "--special-tokens", "<|endoftext|>",
         "--input", tmp_path / "c.jsonl", "--output", tok_dir / "tokenizer.json"])
    for name, text in EXTRAS.items():
        (tok_dir / name).parent.mkdir(exist_ok=True)
        (tok_dir / name).write_text(text)
    run(["prepare", "--tokenizer", tok_dir / "tokenizer.json", "--input", tmp_path / "c.jsonl",
         "--output-prefix", tmp_path / "gc", "--append-eod"])
    (tmp_path / "tiny.yaml").write_text(
        TINY + f"\ndata.path: {tmp_path / 'gc'}\ndata.tokenizer: {tok_dir / 'tokenizer.json'}\n")
    run(["train", tmp_path / "tiny.yaml", "--run-dir", tmp_path / "r"])
    ck = tmp_path / "r" / "checkpoints" / "step-00000002"
    for name, text in EXTRAS.items():
        assert (ck / name).is_file(), f"checkpoint lacks {name}"
        assert (ck / name).read_text() == text, name
    assert (ck / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()

    out = tmp_path / "hf"
    run(["convert", ck, out, "--to", "hf"])
    for name, text in EXTRAS.items():
        assert (out / name).read_text() == text, name
    assert (out / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
