"""`lathe generate` (src/infer/, docs/INFERENCE.md) against transformers on the CPU.

  - greedy output is token-identical to transformers' `generate` (fp32) for gpt2, llama, mistral
    (a sliding window shorter than the output), qwen2 and gpt_neox on the parity fixtures
    (tests/fixtures/models, random weights written by transformers), with prompts of different
    lengths in one batch each giving its single-prompt output;
  - sampled output with a fixed seed is reproducible and independent of the batch size;
  - stop token ids (generation_config.json's eos_token_id) and stop strings end the output where
    the contract says; text is the tokenizer's decode of the ids; the chat template renders
    {"messages"} as transformers' apply_chat_template; --prompt streams the same text;
  - bad input gets `lathe: error:` naming the file and line (or flag), and leaves no output.
"""
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from lathe_cli import ROOT, run

MODELS = ROOT / "tests" / "fixtures" / "models"
FAMILIES = ["gpt2", "llama", "mistral", "qwen2", "gpt_neox"]
PROMPTS = [[5, 9, 17], [3, 4, 5, 6, 7, 8, 9, 10], [200], [11, 12, 13, 14, 15]]
NEW = 12


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def hf_greedy(folder, prompt, new=NEW):
    """transformers' greedy continuation and the smallest top-2 logit gap along it."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                         output_scores=True, return_dict_in_generate=True)
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), min(gaps)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_transformers_in_one_batch(family, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": p} for p in PROMPTS])
    out = tmp_path / "out.jsonl"
    run(["generate", "--checkpoint", MODELS / family, "--input", inp, "--output", out,
         "--max-new-tokens", NEW, "--temperature", 0, "--batch-size", 3, "--device", "cpu"])
    got = read_jsonl(out)
    assert len(got) == len(PROMPTS)
    for prompt, line in zip(PROMPTS, got):
        want, gap = hf_greedy(MODELS / family, prompt)
        # fp32 on both sides: the logits agree to ~1e-6 relative, far below the gaps here.
        assert line["ids"] == want, f"{family} prompt {prompt}: smallest top-2 gap {gap:.3g}"
        assert line["text"] == ""  # the fixtures have no tokenizer


def test_prompts_prefilled_in_small_chunks_give_the_same_greedy_ids(tmp_path):
    # --prefill-chunk 3: each prompt in pieces of 3 tokens, each attending to the cached prefix.
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": p} for p in PROMPTS])
    outs = []
    for chunk in (0, 3):
        out = tmp_path / f"out{chunk}.jsonl"
        run(["generate", "--checkpoint", MODELS / "llama", "--input", inp, "--output", out,
             "--max-new-tokens", NEW, "--temperature", 0, "--prefill-chunk", chunk, "--device", "cpu"])
        outs.append([r["ids"] for r in read_jsonl(out)])
    assert outs[0] == outs[1]
    assert max(len(p) for p in PROMPTS) > 3  # some prompt is cut into several chunks


def sample(folder, tmp_path, name, seed, batch):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": p} for p in PROMPTS])
    out = tmp_path / f"{name}.jsonl"
    run(["generate", "--checkpoint", folder, "--input", inp, "--output", out, "--max-new-tokens",
         NEW, "--temperature", 0.9, "--top-k", 100, "--top-p", 0.95, "--min-p", 0.01,
         "--repetition-penalty", 1.1, "--seed", seed, "--batch-size", batch])
    return [r["ids"] for r in read_jsonl(out)]


def test_sampling_is_reproducible_and_batch_independent(tmp_path):
    folder = MODELS / "llama"
    a = sample(folder, tmp_path, "a", 5, 3)
    assert a == sample(folder, tmp_path, "b", 5, 3)
    assert a == sample(folder, tmp_path, "c", 5, 1)
    assert a != sample(folder, tmp_path, "d", 6, 3)
    greedy, _ = hf_greedy(folder, PROMPTS[0])
    assert a[0] != greedy  # sampling did sample (near-uniform random-weight logits)


def test_stop_token_id_from_generation_config(tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(MODELS / "llama", folder)
    greedy, _ = hf_greedy(MODELS / "llama", PROMPTS[1])
    stop = greedy[4]
    first = greedy.index(stop)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [999, stop]}))
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": PROMPTS[1]}])
    out = tmp_path / "out.jsonl"
    run(["generate", "--checkpoint", folder, "--input", inp, "--output", out, "--temperature", 0,
         "--max-new-tokens", NEW])
    assert read_jsonl(out)[0]["ids"] == greedy[: first + 1]


# A byte-level tokenizer of exactly the fixtures' 256 ids and a chat template.
CHAT_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[assistant] {% endif %}")


def with_tokenizer(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = tmp_path / "tok"
    shutil.copytree(MODELS / "llama", folder)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    assert len(vocab) == 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}))
    return folder, transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"),
                                                        chat_template=CHAT_TEMPLATE)


def test_text_chat_stop_strings_and_streaming(tmp_path):
    folder, hf_tok = with_tokenizer(tmp_path)
    messages = [{"role": "user", "content": "hi there"}]
    chat_ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(chat_ids, list):  # a BatchEncoding in newer transformers
        chat_ids = list(chat_ids["input_ids"])
    prompt_ids = hf_tok("hello")["input_ids"]
    rows = [{"messages": messages}, {"prompt_ids": chat_ids}, {"prompt": "hello"},
            {"prompt_ids": prompt_ids}]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    run(["generate", "--checkpoint", folder, "--input", inp, "--output", out, "--temperature", 0,
         "--max-new-tokens", NEW])
    got = read_jsonl(out)
    assert got[0] == got[1] and got[2] == got[3]
    for r in got:
        assert r["text"] == hf_tok.decode(r["ids"], skip_special_tokens=True)
    want, _ = hf_greedy(folder, chat_ids)
    assert got[0]["ids"] == want
    # --chat wraps a prompt as one user message.
    run(["generate", "--checkpoint", folder, "--input",
         write_jsonl(tmp_path / "c.jsonl", [{"prompt": "hi there"}]), "--output",
         tmp_path / "c_out.jsonl", "--temperature", 0, "--max-new-tokens", NEW, "--chat"])
    assert read_jsonl(tmp_path / "c_out.jsonl")[0] == got[0]

    # A stop string: the output ends with the token that completed it, the text right after it.
    # Sampled, so that the text varies (greedy random-weight output repeats one token); each id
    # of this byte-level tokenizer is one byte, so an ASCII id is its character.
    sampled = ["--temperature", 1, "--seed", 3, "--max-new-tokens", 24]
    run(["generate", "--checkpoint", folder, "--input",
         write_jsonl(tmp_path / "s.jsonl", [{"prompt": "hi there"}]), "--output",
         tmp_path / "free.jsonl", *sampled])
    free = read_jsonl(tmp_path / "free.jsonl")[0]
    ids, text = free["ids"], free["text"]
    j = next(j for j in range(1, len(ids))
             if 33 <= ids[j] < 127 and ids[j] not in ids[:j] and chr(ids[j]) not in text[:j])
    stop = hf_tok.decode([ids[j]])
    run(["generate", "--checkpoint", folder, "--input", tmp_path / "s.jsonl", "--output",
         tmp_path / "s_out.jsonl", *sampled, "--stop", "zzz", "--stop", stop])
    s = read_jsonl(tmp_path / "s_out.jsonl")[0]
    assert s["ids"] == ids[: j + 1]
    assert s["text"] == hf_tok.decode(ids[: j + 1]) and s["text"].endswith(stop)

    # --prompt streams the same text to stdout.
    p = run(["generate", "--checkpoint", folder, "--prompt", "hi there", *sampled])
    assert p.stdout == text + "\n"


def error_of(args, tmp_path, out_name="out.jsonl"):
    out = tmp_path / out_name
    p = run(["generate", *args, "--output", out], check=False)
    assert p.returncode != 0
    assert p.stderr.startswith("lathe: error:"), p.stderr
    assert not out.exists()
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(out_name + ".tmp")]
    return p.stderr


@pytest.mark.parametrize("line,needle", [
    ('{"prompt_ids": [1, 2]', "not a JSON object"),
    ('[1, 2]', "not a JSON object"),
    ('{"text": "x"}', "exactly one of"),
    ('{"prompt": "a", "prompt_ids": [1]}', "exactly one of"),
    ('{"prompt_ids": [1, "b"]}', "not a token id"),
    ('{"prompt_ids": [1, -3]}', "not a token id"),
    ('{"prompt_ids": []}', "no tokens"),
    ('{"prompt_ids": [1, 256]}', "outside the vocabulary"),
    ('{"prompt": "no tokenizer here"}', "no tokenizer.json"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no chat template"),
    ('{"messages": "x"}', "must be a list"),
])
def test_bad_lines_name_file_and_line(line, needle, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt_ids": [1]}\n\n' + line + "\n")
    err = error_of(["--checkpoint", MODELS / "llama", "--input", inp], tmp_path)
    assert needle in err
    if needle != "outside the vocabulary":
        assert f"{inp}:3" in err
    else:
        assert "request 1" in err


@pytest.mark.parametrize("flags,needle", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-k", "-1"], "--top-k"),
    (["--min-p", "2"], "--min-p"),
    (["--repetition-penalty", "0"], "--repetition-penalty"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--batch-size", "0"], "--batch-size"),
    (["--prefill-chunk", "-1"], "--prefill-chunk"),
    (["--device", "tpu"], "--device"),
    (["--stop", "x"], "tokenizer.json"),
])
def test_bad_flags_are_named(flags, needle, tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    err = error_of(["--checkpoint", MODELS / "llama", "--input", inp, *flags], tmp_path)
    assert needle in err


def test_other_errors(tmp_path):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}])
    assert "cannot open" in error_of(["--checkpoint", MODELS / "llama", "--input",
                                      tmp_path / "missing.jsonl"], tmp_path)
    assert "exactly one of --input" in error_of(["--checkpoint", MODELS / "llama"], tmp_path)
    assert "exactly one of --input" in error_of(
        ["--checkpoint", MODELS / "llama", "--input", inp, "--prompt", "x"], tmp_path)
    assert "--checkpoint" in error_of(["--checkpoint", tmp_path / "nothing", "--input", inp],
                                      tmp_path)
    # gpt2's context is 64 positions.
    long = write_jsonl(tmp_path / "long.jsonl", [{"prompt_ids": [1] * 64}])
    assert "no room" in error_of(["--checkpoint", MODELS / "gpt2", "--input", long], tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "no prompts" in error_of(["--checkpoint", MODELS / "llama", "--input", empty],
                                    tmp_path)


def test_a_broken_chat_template_is_named(tmp_path):
    folder, _ = with_tokenizer(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for %}"}))
    inp = write_jsonl(tmp_path / "in.jsonl", [{"messages": [{"role": "user", "content": "x"}]}])
    err = error_of(["--checkpoint", folder, "--input", inp], tmp_path)
    assert "tokenizer_config.json" in err and f"{inp}:1" in err
