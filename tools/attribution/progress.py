"""tools.attribution's job store: OUT/block.pt (Progress, the block under way, a sampling call at a time) and
OUT/rollouts.jsonl (a line per problem and per located rollout, checked before the model loads: check_lines).
Why its own store: a block of a real model's problems takes hours on a CPU, and a kill must cost one sampling call,
not the block."""
import contextlib
import hashlib
import json
import os
import shutil
import sys

import torch
from tqdm import tqdm


PROGRESS = "block.pt"  # the work so far of the block under way (Progress)


class Progress:
    """The work so far of the block under way, kept in OUT/block.pt so that a killed run loses at most one sampling
    call, not the block: on Qwen2.5-Coder-0.5B, on a 2-core host without AVX512, a block of 8 problems was still
    bisecting after 110 minutes, and a block of the 1.5B would outlast a session (docs/LOG.md, 2026-11-28,
    nineteenth session). The block's groups are kept once drawn (--responses: a block is one given answer, nothing
    drawn), then every sampling call of F2 (World.values: v(question), each probe) with what it returned and the
    random state after it. A resumed block runs as before, each call answered from the save while the save has it,
    and the random state of the last is restored: from there it draws what a run never stopped would have drawn (on
    the same machine, --threads and device). Written aside, then renamed: a kill while saving leaves the last whole
    save. A save of another block (another --limit's last block, or one already written) is not used."""

    def __init__(self, out: str, block: range, device: str = "cpu", given: bool = False):
        self.path, self.key, self.device = os.path.join(out, PROGRESS), [block[0], block[-1] + 1], str(device)
        self.name = f"answer {block[0]}" if given else f"problems {block[0]}-{block[-1]}"
        self.state, self.answered = {"block": self.key, "calls": []}, 0
        saved = self.read(self.path)
        if isinstance(saved, dict) and saved["block"] == self.key:
            self.state = saved
            tqdm.write(f"{self.name}: continued from {self.path}" + (", the groups" if "groups" in saved else "")
                       + f", {len(saved['calls'])} sampling calls")

    @staticmethod
    def read(path: str, say: bool = True):
        """The save at path; None if there is none, or "unreadable" for a file that is not a save this class wrote
        (said in one line where say: its block then runs again whole)."""
        if not os.path.exists(path):
            return None
        try:
            saved = torch.load(path, weights_only=True)
            assert isinstance(saved, dict) and isinstance(saved["block"], list) and isinstance(saved["calls"], list)
            return saved
        except Exception as e:  # noqa: BLE001 (anything else: not a save this class wrote)
            if say:
                tqdm.write(f"{path}: not a save of a block ({type(e).__name__}); its block runs again whole")
            return "unreadable"

    def get(self, name: str):
        return self.state.get(name)

    def save(self, **parts):
        self.state.update(parts, rng=torch.get_rng_state())
        if self.device.startswith("cuda"):  # the device's sampler draws from the device's own generator
            self.state["device_rng"] = torch.cuda.get_rng_state(self.device)
        elif self.device.startswith("mps"):
            self.state["device_rng"] = torch.mps.get_rng_state()
        try:
            torch.save(self.state, self.path + ".tmp")
            os.replace(self.path + ".tmp", self.path)
        except Exception as e:  # noqa: BLE001 (torch.save's writer raises its own kind on a full disk, not OSError)
            # whole or nothing, as infra/checkpoint.save: the cut .tmp goes, the last whole save stays for the rerun
            with contextlib.suppress(OSError):
                os.remove(self.path + ".tmp")
            free = shutil.disk_usage(os.path.dirname(self.path) or ".").free / 2 ** 20
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            sys.exit(f"{self.path}: the work so far of {self.name} could not be saved ({first}; {free:.0f} MiB free "
                     f"there): free space and run the same command again, which continues from the last whole save")

    def call(self, asked, draw):
        """One sampling call of the block: draw() -> its values. asked (JSON: what the call samples from) names it:
        the killed run's answer to the same call, in the same place, is returned in its stead."""
        key = hashlib.sha256(json.dumps(asked).encode()).hexdigest()[:16]
        calls = self.state["calls"]
        if self.answered < len(calls):
            if calls[self.answered][0] == key:
                self.answered += 1
                if self.answered == len(calls):
                    self.resume_random()
                return calls[self.answered - 1][1]
            tqdm.write(f"{self.path}: call {self.answered + 1} of its {len(calls)} asks otherwise here; "
                       f"sampled from there")
            del calls[self.answered:]
        values = draw()
        calls.append([key, values])
        self.answered += 1
        self.save()
        return values

    def resume_random(self):
        """The random state after the saved calls: where a run never stopped would be now."""
        torch.set_rng_state(self.state["rng"])
        if "device_rng" in self.state and self.device.startswith("cuda"):
            torch.cuda.set_rng_state(self.state["device_rng"], self.device)
        elif "device_rng" in self.state and self.device.startswith("mps"):
            torch.mps.set_rng_state(self.state["device_rng"])

    def done(self):
        self.remove(self.path)

    @staticmethod
    def remove(path: str):
        for name in (path, path + ".tmp"):
            if os.path.exists(name):
                os.remove(name)

    @staticmethod
    def clear(out: str, blocks: list):
        """Delete OUT's save if it is of one of `blocks` (all written: a kill just after a block's lines leaves its
        save) or unreadable. A save of a block beyond them (a larger --limit's) is kept for that run."""
        path = os.path.join(out, PROGRESS)
        saved = Progress.read(path, say=False)
        if saved == "unreadable" or isinstance(saved, dict) and saved["block"] in [[b[0], b[-1] + 1] for b in blocks]:
            Progress.remove(path)


# What the report and a resumed run read of each line of OUT's rollouts.jsonl, by kind, and the type of each
PROBLEM_KEYS = {"problem": int, "done": bool, "correct": int, "group": int, "mixed": bool}
MIXED_KEYS = {"v0": (int, float), "wrong": int}
ROLLOUT_KEYS = {"problem": int, "rollout": int, "question": str, "gold": str, "response": str, "steps": list,
                "v0": (int, float), "first_wrong_step": int, "blame": dict, "scores": dict}


def line_problem(x):
    """What a line of rollouts.jsonl lacks for the report and a resumed run, or None."""
    if not isinstance(x, dict):
        return f"a JSON {type(x).__name__}, not an object"
    keys = ROLLOUT_KEYS if "rollout" in x else {**PROBLEM_KEYS, **(MIXED_KEYS if x.get("mixed") else {})} \
        if x.get("done") else None
    if keys is None:
        return "neither a problem's line (\"done\": true) nor a located rollout's (\"rollout\")"
    for k, kind in keys.items():
        if k not in x:
            return f"no \"{k}\""
        if not isinstance(x[k], kind) or (kind is int and isinstance(x[k], bool)):
            return f"\"{k}\" is {json.dumps(x[k])}"
    if "rollout" in x and not all(isinstance(s, dict) and "tokens" in s and "text" in s for s in x["steps"]):
        return "a step without its \"tokens\" or \"text\""
    return None


def check_lines(path: str):
    """Every line of OUT's rollouts.jsonl is one the report and a resumed run can read, checked before the model
    loads: one line naming the file, the line and what it lacks otherwise (a hand-edited line gave a KeyError
    after the model's minutes). A kill cuts the last line only: that one is left to read_lines, which drops it."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.read().split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    for k, line in enumerate(lines, 1):
        try:
            why = line_problem(json.loads(line))
        except json.JSONDecodeError as e:
            if k == len(lines):
                return
            why = f"not JSON ({e}), and not the last line (a killed run cuts only that one)"
        if why:
            sys.exit(f"{path}:{k}: {why}: mend or delete the line, or pass another --out")


def read_lines(path: str) -> list:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill: that problem runs again
                break
    return out
