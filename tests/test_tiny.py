"""The tiny world: task, tokenizer (the AutoTokenizer pitfall), model size, held-out separation."""
import os
import subprocess
import sys
import random

from transformers import AutoModelForCausalLM, AutoTokenizer

from toyworld import tiny


def test_task_by_hand():
    # 7+8-9: 7+8 = 15, 15-9 = 6
    assert tiny.answer("7+8-9") == "6"
    assert tiny.solution("7+8-9") == "7+8=15\n15-9=6\n\\boxed{6}"
    assert tiny.prompt("7+8-9") == "Q:7+8-9=?\nA:"
    assert tiny.answer("1-7-4") == "-10"


def test_checkpoint_dir_round_trips_through_auto_classes(tmp_path):
    # a known trap: AutoTokenizer in a qwen2 model directory must keep spaces and newlines
    tok = tiny.build_tokenizer()
    model = tiny.build_model(tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    text = "Q:3+5=?\nA: 8"
    assert auto(text)["input_ids"] == tok(text)["input_ids"]
    assert auto.decode(auto(text)["input_ids"]) == text
    assert auto.eos_token_id == auto.pad_token_id == tok.eos_token_id
    assert len(tok(text)["input_ids"]) == len(text)  # one token per character
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    n = sum(p.numel() for p in loaded.parameters())
    assert 0.5e6 < n < 1.5e6


def test_a_build_that_loses_the_race_leaves_no_copy_behind(tmp_path, monkeypatch):
    # two runs building one seed's base at once: the second to finish keeps the first one's model, and its own
    # temporary copy went to .cache as junk
    def other_run_finishes_first(model, tokenizer, **kwargs):
        model.save_pretrained(tmp_path / "tiny-base-seed0")
        tokenizer.save_pretrained(tmp_path / "tiny-base-seed0")
    monkeypatch.setattr(tiny, "warm_start", other_run_finishes_first)
    tiny.load_or_build(cache_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["tiny-base-seed0", "tiny-base-seed0.lock"]


def test_a_second_builder_waits_while_the_first_holds_the_lock(tmp_path):
    # the suite's two workers, or two compare --jobs runs, asking for one base at once: while one process checks and
    # builds, another cannot take the lock (it would wait); once the first is done, it can
    path = str(tmp_path / "tiny-base-seed0")
    probe = ("import fcntl, sys\nf = open(sys.argv[1], 'a')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    sys.exit(7)\n")
    with tiny.one_builder(path):
        assert subprocess.run([sys.executable, "-c", probe, path + ".lock"]).returncode == 7
    assert subprocess.run([sys.executable, "-c", probe, path + ".lock"]).returncode == 0


def test_another_users_lock_is_shared_to_read_or_said_in_one_line(tmp_path, monkeypatch):
    # round four: the lock file of a shared .cache, made by another user (0644), gave a PermissionError traceback
    # (opened to append); flock takes a file opened to read, so the builds still take turns; one that cannot be
    # opened at all is one line naming it and its owner
    import builtins
    import pytest
    path = str(tmp_path / "tiny-base-seed0")
    open(path + ".lock", "w").close()
    refused_modes = {"a"}

    def as_another_user(file, mode="r", *args, **kwargs):
        if str(file).endswith(".lock") and mode in refused_modes:
            raise PermissionError(13, "Permission denied", file)
        return builtins.open(file, mode, *args, **kwargs)
    monkeypatch.setattr(tiny, "open", as_another_user, raising=False)
    probe = ("import fcntl, sys\nf = open(sys.argv[1], 'a')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    sys.exit(7)\n")
    with tiny.one_builder(path):  # opened to read: still the lock another process waits on
        assert subprocess.run([sys.executable, "-c", probe, path + ".lock"]).returncode == 7
    refused_modes.add("r")
    with pytest.raises(SystemExit) as e:
        with tiny.one_builder(path):
            pass
    said = str(e.value.code)
    assert said.startswith(f"{path}.lock: the lock of a shared model build cannot be opened (Permission denied; "
                           f"owned by ") and "chmod a+r" in said and "\n" not in said, said


def test_training_never_sees_held_out_problems():
    held = set(tiny.eval_problems())
    assert len(held) == tiny.N_EVAL
    drawn = tiny.train_problems(random.Random(0), 5000, held)
    assert not held & set(drawn)


def test_sft_batch_masks_the_prompt():
    tok = tiny.build_tokenizer()
    ids, labels = tiny.sft_batch(tok, ["1+2"])
    n_prompt = len(tiny.prompt("1+2"))
    assert (labels[0, :n_prompt] == -100).all()
    target = tok(tiny.solution("1+2"))["input_ids"] + [tok.eos_token_id]
    assert labels[0, n_prompt:].tolist() == target


def test_warm_start_lowers_the_loss():
    tok = tiny.build_tokenizer()
    model = tiny.build_model(tok)
    ids, labels = tiny.sft_batch(tok, ["1+2", "3-4+5"])
    before = model(input_ids=ids, labels=labels).loss.item()
    tiny.warm_start(model, tok, steps=30, batch_size=16)
    after = model(input_ids=ids, labels=labels).loss.item()
    assert after < before - 0.5
