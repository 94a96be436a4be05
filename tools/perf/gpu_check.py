"""The one GPU check: the whole one-GPU path on your GPU in one command, every number in one JSON (docs/gpu.md).

    python -m tools.perf.gpu_check --out DIR                 # on a CUDA device, about 6-9 minutes
    python -m tools.perf.gpu_check --sizes recipe --out DIR  # memory and steps at docs/gpu.md's recipe, 25-35 min
    python -m tools.perf.gpu_check --device cpu --out DIR    # the rehearsal: the same code at a tiny width
    bash tools/perf/gpu_check.sh                             # the same on a machine without a package index

Parts, in order of value, each in its own process with its own time cap (a hang ends that part, not the check), and
all of them within --budget seconds (a part gets what is left, at most its cap):
  setup     a randomly initialised model of Qwen2.5-Math-1.5B's configuration (no weights to download), a
            tokenizer of its vocabulary, and problems of a fixed prompt length
  tests     tests/test_on_device.py with TEST_DEVICE set: the sampler against generate, log-probs against the
            training forward, each method's step, bf16, a checkpoint that reopens and resumes, LoRA
  machine   bf16 and float32 matmul rates at the model's shapes, memory bandwidth
  sampler   our sampler (two-matmul and SDPA decode attention) against model.generate at the recipe's batch
  steps     seconds a step of grpo, ktae, oar-g and oar-p, and the training pass's MFU against the machine part's rate
  memory    --dry-run's plan against each phase's measured peak, full-parameter and LoRA rank 8
  oar-g     OAR-G's advantage phase at its default chunk: measured on the steps' lengths, planned at the memory part's
  train     recipes/gpu-1.5b.yaml and recipes/gpu-1.5b-lora.yaml on the random model, shortened: a step saved,
            --resume for one more, evaluate.py on the checkpoint

What it writes (DIR): gpu_check.json (every number, each part's status and seconds), gpu_check.log (each part's
start and end, and all it printed), tests.xml (pytest's report), and the two recipe runs' metrics.jsonl. The sizes
are SIZES[--sizes]: "quick" on a GPU by default, "recipe" at the recipe's lengths, and on a CPU "cpu", the same code at
a tiny width (the rehearsal that tests/test_gpu_check.py runs, so that a typo or a missing file fails here first).
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass

from infra import cli, files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/perf/ is two down
WHEELS = os.path.join(ROOT, "requirements", "gpu-check-wheels.txt")
WHEEL_DIR = os.path.join(ROOT, ".whl")
WHEEL_BUDGET = 48 * 2**20  # gpu_check.sh's wheels: a machine that receives the tree, not the index, is sent them


@dataclass(frozen=True)
class Part:
    name: str
    cap: int  # seconds: the most this part may take
    what: str


# Caps sum to more than the budget: a part that ends early leaves its time to the later ones. The expected seconds on
# an H100/H200 at the quick sizes (docs/gpu.md, "The GPU check") are about half of each cap; --sizes recipe scales
# every cap by RECIPE_SCALE.
PARTS = [Part("setup", 60, "the random model, its tokenizer and the problems"),
         Part("tests", 150, "tests/test_on_device.py on the device"),
         Part("machine", 45, "matmul rates and memory bandwidth"),
         Part("sampler", 90, "our sampler against model.generate"),
         Part("steps", 180, "seconds a step of grpo, ktae, oar-g, oar-p; training MFU"),
         Part("memory", 120, "the plan against measured peaks, full-parameter and LoRA rank 8"),
         Part("oar-g", 60, "OAR-G's advantage phase at its default chunk, measured and planned"),
         Part("train", 180, "the two GPU recipes: a step, --resume, evaluate.py")]
BUDGET = 590  # seconds for all parts at the quick sizes (a part that hangs cannot hold the check longer)
RECIPE_SCALE = 5  # --sizes recipe: its caps and budget this many times the quick sizes' (25-35 minutes in all)
STEP_METHODS = ["grpo", "ktae", "oar-g", "oar-p"]


@dataclass(frozen=True)
class Sizes:
    shapes: dict  # Qwen2.5-Math-1.5B's config fields replaced (benchparts.gpu.QWEN25_MATH_15B)
    prompt_tokens: int  # every problem's prompt, in tokens
    sampler_prompts: int  # the sampler's batch: the recipe's --gen-batch-size prompts x its G
    group: int  # the recipe's G
    sampler_tokens: int
    step_prompts: int  # prompts a step in the steps part (G / 2 rollouts each) and the train part
    step_tokens: int
    short_tokens: int  # OAR-P's responses (one forward per reasoning token)
    memory_tokens: int  # the memory part's responses (the recipe's other settings)
    train_tokens: int  # the train part's responses


SIZES = {
    # 28 layers, 151,936 ids: 1.54B parameters. A random model samples to the length limit, so each length is the
    # work done: the sampler 128 rows x 256 tokens, a step 16 rollouts x 128, the memory part 32 x 256
    "quick": Sizes({}, 128, 8, 16, 256, 2, 128, 32, 256, 128),
    # docs/gpu.md's recipe: 256-token prompts, the memory part's 8 prompts x G = 16 to 3,072 tokens (its peaks are
    # those of one generation batch of 8 prompts and of one micro-batch, as at the recipe's 16 prompts), steps and
    # the sampler at 512 tokens
    "recipe": Sizes({}, 256, 8, 16, 512, 8, 512, 64, 3072, 128),
    # the rehearsal: 2 layers of width 128, a few tokens: every part runs its code in seconds on a CPU. 2,048 ids, so
    # that the tokenizer's filler tokens "<i>" (benchparts.gpu.write_tokenizer) are of both parities, 5 and 6
    # characters, and the length-parity grader mixes groups (with 512 ids every token decodes to an odd length, and
    # 8 tokens always to an even one)
    "cpu": Sizes({"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 2048, "bos_token_id": 2047, "eos_token_id": 2047,
                  "pad_token_id": 2047, "max_position_embeddings": 512}, 96, 2, 8, 8, 2, 8, 4, 8, 8),
}


def log(text: str):
    print(f"[{time.strftime('%H:%M:%S')}] gpu_check: {text}", flush=True)


def sizes_for(device: str, sizes: str = "quick") -> Sizes:
    """--sizes on a GPU; on a CPU always the rehearsal's."""
    return SIZES[sizes if device.startswith("cuda") else "cpu"]


# ---- the parts, each run in its own process: python -m tools.perf.gpu_check --part NAME --work DIR ...

def base_flags(work: str, device: str, threads) -> tuple:
    """train.py's flags every part shares: the random model and its problems, the stand-in grader (length parity:
    a random model's groups mix, so every step does its whole work), nothing evaluated or saved unless asked."""
    p = os.path.join(work, "problems.jsonl")
    return ("--model", os.path.join(work, "model"), "--dataset", p, "--eval-dataset", p, "--eval-limit", "1",
            "--eval-batch-size", "1", "--device", device, "--grader", "length-parity", "--temperature", "1.0",
            "--lr", "1e-6", "--warmup-steps", "0", *(("--threads", str(threads)) if threads else ()))


QUIET = ("--no-final-eval", "--no-final-save", "--eval-every", "0", "--save-every", "0")


def part_setup(a, s: Sizes, table):
    from tools.perf.benchparts import gpu
    cfg = gpu.write_model(os.path.join(a.work, "model"), s.shapes, a.device)
    gpu.write_problems(os.path.join(a.work, "problems.jsonl"), s.prompt_tokens)
    from infra import memory
    table.row("setup", f"random Qwen2.5-Math-1.5B configuration: {cfg.num_hidden_layers} layers, {cfg.vocab_size:,} "
                       f"ids", f"{memory.n_params(cfg) / 1e9:.3f} B")


def part_tests(a, s: Sizes, table):
    xml = os.path.join(a.out, "tests.xml")
    env = {**os.environ, "TEST_DEVICE": a.device, "PYTHONUNBUFFERED": "1"}
    if a.threads:
        env["TEST_THREADS"] = str(a.threads)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_on_device.py",
           f"--junitxml={xml}", *a.pytest_args]
    log(" ".join(cmd[1:]))
    r = subprocess.run(cmd, cwd=ROOT, env=env)
    counts, failed = junit_counts(xml)
    table.row("tests", f"tests/test_on_device.py on {a.device}: passed / failed / skipped",
              f"{counts['passed']} / {counts['failed']} / {counts['skipped']}")
    for name, message in failed:
        table.fail("tests", f"{name}: {message}")
    if r.returncode not in (0, 1) or counts["passed"] + counts["failed"] == 0:
        table.fail("tests", f"pytest ended with exit {r.returncode}")


def junit_counts(path: str) -> tuple:
    """({"passed", "failed", "skipped"}: counts, [(test, first line of its failure)]) of pytest's JUnit XML."""
    counts, failed = {"passed": 0, "failed": 0, "skipped": 0}, []
    if not os.path.exists(path):
        return counts, failed
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            message = (bad.get("message") or "?").strip().replace("\n", " ")
            failed.append((case.get("name"), message[:200]))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failed


def model_config(work: str):
    from infra import models
    return models.load_config(os.path.join(work, "model"))


def part_machine(a, s: Sizes, table):
    from tools.perf.benchparts.machine import machine_rows
    cfg = model_config(a.work)
    limits = machine_rows(table, cfg, s.sampler_prompts * s.group, 4 * (s.prompt_tokens + s.memory_tokens),
                          a.device, gib=2.0 if a.device.startswith("cuda") else 0.25)
    files.write_json(os.path.join(a.work, "machine.json"), limits)  # the steps part's MFU reads it


def part_sampler(a, s: Sizes, table):
    from tools.perf.benchparts.sampler import gpu_sampler_rows
    flags = base_flags(a.work, a.device, a.threads) + (
        "--prompts-per-step", str(s.sampler_prompts), "--group-size", str(s.group), "--max-new-tokens",
        str(s.sampler_tokens), "--bf16")
    gpu_sampler_rows(table, os.path.join(a.work, "model"), flags, repeat=1)


def part_steps(a, s: Sizes, table):
    from tools.perf.benchparts.steps import step_rows
    from tools.perf.benchparts.workload import Setting, training_flops
    from tools.perf.benchparts.table import rate
    G = s.group // 2
    flags = base_flags(a.work, a.device, a.threads) + QUIET + (
        "--prompts-per-step", str(s.step_prompts), "--group-size", str(G), "--max-new-tokens", str(s.step_tokens),
        "--bf16", "--micro-batch-size", str(G))
    setting = Setting((), steps=2, warmup=1, short=("--max-new-tokens", str(s.short_tokens)))
    rows = step_rows(table, flags, a.methods, setting, None)
    machine = os.path.join(a.work, "machine.json")
    r = rows.get(a.methods[0])
    if r and os.path.exists(machine):
        peak = json.load(open(machine))["bfloat16"]["train"]
        mixed = 1 - r["zero_adv_groups"]
        if not mixed:  # length parity left every group of the timed step unmixed: no training pass to time
            table.row("step", f"{a.methods[0]} training MFU: not measured (no group mixed in the timed step)")
            return
        responses = mixed * s.step_prompts * G * r["response_len"]
        prompts = mixed * s.step_prompts * s.prompt_tokens
        flops = training_flops(model_config(a.work), responses, prompts) / r["time_train"]
        table.row("step", f"{a.methods[0]} training MFU ({responses + prompts:,.0f} tokens a step), bfloat16",
                  rate(flops, "FLOP/s"), rate(peak, "FLOP/s"), f"{100 * flops / peak:.0f} %")


def part_memory(a, s: Sizes, table):
    from tools.perf.benchparts.gpu import memory_rows
    recipe = recipe_flags(a, s)
    memory_rows(table, "full-parameter", recipe, "ktae", None)
    memory_rows(table, "LoRA rank 8", recipe + ("--lora-rank", "8", "--lr", "1e-5"), "ktae", None)


def recipe_flags(a, s: Sizes) -> tuple:
    """The memory part's train.py flags: docs/gpu.md's recipe at the sizes' lengths."""
    return base_flags(a.work, a.device, a.threads) + QUIET + (
        "--prompts-per-step", str(s.step_prompts), "--group-size", str(s.group), "--max-new-tokens",
        str(s.memory_tokens), "--beta", "0.001", "--bf16", "--grad-checkpointing", "--micro-batch-size", "4",
        "--gen-batch-size", "8")


def part_oar_g(a, s: Sizes, table):
    """OAR-G's peak is set by its chunk of rollouts and their length, not by how many a step has: measured at its
    default chunk on the steps' responses, and planned (--dry-run, not run: at the recipe's 3,072 tokens its default
    chunk needs more memory than one GPU has) at the memory part's."""
    from tools.perf.benchparts.gpu import memory_rows, oar_g_plan_row
    recipe = recipe_flags(a, s)
    measured = recipe + ("--prompts-per-step", str(max(1, s.step_prompts // 4)), "--max-new-tokens", str(s.step_tokens))
    memory_rows(table, f"OAR-G at its default chunk, {s.step_tokens} tokens", measured, "oar-g", None,
                phases=("advantage",))
    oar_g_plan_row(table, model_config(a.work), recipe, s.prompt_tokens)


def part_train(a, s: Sizes, table):
    """Each GPU recipe with its flags as written, but the model, the problems and the sizes: one step saved, then
    --resume for a second, then evaluate.py on the checkpoint. Its metrics.jsonl comes back."""
    p = os.path.join(a.work, "problems.jsonl")
    for recipe, name in (("recipes/gpu-1.5b.yaml", "full"), ("recipes/gpu-1.5b-lora.yaml", "lora")):
        run_dir = os.path.join(a.work, f"run-{name}")
        flags = ["--config", recipe, "--model", os.path.join(a.work, "model"), "--dataset", p, "--eval-dataset", p,
                 "--eval-limit", "2", "--eval-batch-size", "2", "--prompts-per-step", str(s.step_prompts),
                 "--max-new-tokens", str(s.train_tokens), "--grader", "length-parity", "--device", a.device,
                 "--save-every", "1", "--eval-every", "1", "--max-minutes", "2", "--run-dir", run_dir,
                 *(("--threads", str(a.threads)) if a.threads else ())]
        for what, extra in (("a step, saved", ["--steps", "1"]), ("--resume, a second step", ["--steps", "2",
                                                                                              "--resume"])):
            ok, seconds, last = run_logged([sys.executable, "train.py", *flags, *extra])
            steps = [r["step"] for r in read_records(os.path.join(run_dir, "metrics.jsonl")) if "accuracy" in r]
            (table.row if ok else table.fail)("train", f"{recipe}: {what}: steps {steps}" + ("" if ok else f": {last}"),
                                              f"{seconds:.1f} s")
            if not ok:
                break
        if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
            shutil.copy(os.path.join(run_dir, "metrics.jsonl"), os.path.join(a.out, f"metrics-{name}.jsonl"))
        ckpt, out = os.path.join(run_dir, "checkpoint"), os.path.join(a.work, f"eval-{name}.json")
        if not os.path.isdir(ckpt):
            continue
        ok, seconds, last = run_logged([sys.executable, "evaluate.py", "--model", ckpt, "--benchmarks", p,
                                        "--limit", "2", "--batch-size", "2", "--max-new-tokens", str(s.train_tokens),
                                        "--device", a.device, "--out", out,
                                        *(("--threads", str(a.threads)) if a.threads else ())])
        (table.row if ok else table.fail)("train", f"evaluate.py on the {name} checkpoint" + ("" if ok else f": {last}"),
                                          f"{seconds:.1f} s")


def read_records(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_logged(cmd: list) -> tuple:
    """(ok, seconds, its last line of error) of a command whose output goes to this process's (the log)."""
    log(" ".join(cmd[1:]))
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()] or ["no output"]
    return r.returncode == 0, time.time() - t0, f"{lines[-1].strip()[:200]} (exit {r.returncode})"


RUNNERS = {"setup": part_setup, "tests": part_tests, "machine": part_machine, "sampler": part_sampler,
           "steps": part_steps, "memory": part_memory, "oar-g": part_oar_g, "train": part_train}


def run_part(a):
    """One part in this process: its rows (and failures) to WORK/part-NAME.json, rewritten at each row, so that a
    part stopped at its cap still reports what it measured."""
    from infra import cpu
    from tools.perf.benchparts.table import Table

    class Saved(Table):
        def row(self, *cells):
            super().row(*cells)
            files.write_json(os.path.join(a.work, f"part-{a.part}.json"), {
                "rows": [dict(zip(("part", "what", "measured", "against", "ratio"), r)) for r in self.rows],
                "failures": self.failures}, indent=1)

    cpu.setup(a.threads)
    table = Saved(f"gpu_check part {a.part} on {a.device}")
    RUNNERS[a.part](a, sizes_for(a.device, a.sizes), table)
    sys.exit(1 if table.failures else 0)


# ---- the parent: the parts in order, each capped, and one JSON of everything

def device_facts(device: str) -> dict:
    import torch
    import transformers
    facts = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
             "python": sys.version.split()[0]}
    if device.startswith("cuda"):
        facts.update(name=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                     memory_gib=round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1))
    else:
        facts["name"] = "CPU (the rehearsal: tiny sizes)"
    return facts


def check(a) -> dict:
    out = a.out
    os.makedirs(out, exist_ok=True)
    work = a.work or tempfile.mkdtemp(prefix="gpu_check-")
    chosen = [p for p in PARTS if p.name in a.parts]
    report = {**device_facts(a.device), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": a.budget,
              "sizes": asdict(sizes_for(a.device, a.sizes)), "parts": []}
    t0 = time.time()
    for p in chosen:
        left = a.budget - (time.time() - t0)
        entry = {"name": p.name, "what": p.what, "cap_s": p.cap}
        report["parts"].append(entry)
        if left < 5 or (p.name != "setup" and not os.path.exists(os.path.join(work, "model", "config.json"))):
            entry.update(status="skipped", why="no time left" if left < 5 else "setup did not make the model")
            log(f"part {p.name}: skipped ({entry['why']})")
            continue
        cap = int(min(p.cap * a.cap_scale, left))
        log(f"part {p.name}: start (cap {cap} s, {left:.0f} s of the budget left): {p.what}")
        cmd = [sys.executable, "-m", "tools.perf.gpu_check", "--part", p.name, "--work", work, "--out", out,
               "--device", a.device, "--sizes", a.sizes, "--methods", ",".join(a.methods),
               "--cap-scale", str(a.cap_scale),
               *(("--threads", str(a.threads)) if a.threads else ()), *(f"--pytest-arg={x}" for x in a.pytest_args)]
        started = time.time()
        proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)  # its own group: a timeout ends its children
        try:
            rc = proc.wait(timeout=cap)
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"timed out after {cap} s"
        entry.update(status=status, seconds=round(time.time() - started, 1))
        found = os.path.join(work, f"part-{p.name}.json")
        if os.path.exists(found):
            entry.update(json.load(open(found)))
        log(f"part {p.name}: end: {status} in {entry['seconds']} s")
        write_json(out, report, time.time() - t0)
    report["seconds"] = round(time.time() - t0, 1)
    write_json(out, report, report["seconds"])
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return report


def write_json(out: str, report: dict, seconds: float):
    """gpu_check.json, written whole after each part: a check cut off still leaves the parts done."""
    files.write_json(os.path.join(out, "gpu_check.json"), {**report, "seconds": round(seconds, 1)}, indent=1)


def pins() -> dict:
    """{normalised name: version} of requirements/gpu-check-wheels.txt."""
    lines = [x.split("#")[0].strip() for x in open(WHEELS)]
    return {normal(x.split("==")[0]): x.split("==")[1].strip() for x in lines if "==" in x}


def normal(name: str) -> str:
    """A distribution's name as wheel files and pins compare (PEP 503: case, and -, _ and . alike)."""
    return name.lower().replace("-", "_").replace(".", "_")


def wheel_problem(folder: str = None):
    """Why the wheels in folder (.whl/) are not the set gpu_check.sh should install, or None: a wheel that no pin of
    requirements/gpu-check-wheels.txt names at its version (kept from an older fetch), or two of one package (pip
    would refuse both, or install either, on the GPU machine's one call). One line naming the file."""
    folder = folder or WHEEL_DIR
    wanted, seen = pins(), {}
    for f in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not f.endswith(".whl"):
            continue
        name, version = (f.split("-") + [""])[:2]
        where = os.path.join(os.path.relpath(folder, ROOT) if folder.startswith(ROOT) else folder, f)
        if normal(name) in seen:
            return (f"{where}: a second wheel of {name} beside {seen[normal(name)]}: delete the one that "
                    f"{os.path.relpath(WHEELS, ROOT)} does not pin ({name}=={wanted.get(normal(name), '?')})")
        seen[normal(name)] = f
        if wanted.get(normal(name)) != version:
            pinned = f"pins {name}=={wanted[normal(name)]}" if normal(name) in wanted else f"does not name {name}"
            return f"{where}: stale ({os.path.relpath(WHEELS, ROOT)} {pinned}): delete it, then --fetch-wheels"
    return None


def print_problem(problem):
    """problem on stderr (one line), and whether there was one."""
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
    return bool(problem)


def fetch_wheels():
    """pip download of requirements/gpu-check-wheels.txt into .whl/ for the device's Python (3.12, manylinux x86-64),
    then their total size against WHEEL_BUDGET. A host that cannot be reached, or a stale wheel left there, is one
    line."""
    names = [x.split("#")[0].strip() for x in open(WHEELS)]
    names = [x for x in names if x]
    plats = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                         "manylinux2014_x86_64", "manylinux1_x86_64")]
    os.makedirs(WHEEL_DIR, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *plats, "-d", WHEEL_DIR, *names]
    r = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    if r.returncode:  # pip's error, the whole command and a traceback, would bury what to do
        said = [x.strip() for x in r.stderr.splitlines() if x.startswith("ERROR")] or ["no message"]
        unreachable = any(m in r.stderr for m in ("from versions: none", "NewConnectionError", "Connection refused",
                                                  "Max retries", "Name or service not known", "timed out"))
        where = os.environ.get("PIP_INDEX_URL") or "pip's index"
        sys.exit("--fetch-wheels: " + (f"the wheel host ({where}) could not be reached" if unreachable else
                                        "pip download failed") + f" (pip: {said[0]}): run --fetch-wheels on a machine "
                 f"that reaches it, or copy the wheels {os.path.relpath(WHEELS, ROOT)} pins into {WHEEL_DIR}")
    if wheel_problem():
        sys.exit(f"--fetch-wheels: {wheel_problem()}")
    total = sum(os.path.getsize(os.path.join(WHEEL_DIR, f)) for f in os.listdir(WHEEL_DIR) if f.endswith(".whl"))
    print(f"{WHEEL_DIR}: {len(names)} wheels, {total / 2**20:.1f} MiB (budget {WHEEL_BUDGET / 2**20:.0f} MiB)")
    if total > WHEEL_BUDGET:
        sys.exit(f"{WHEEL_DIR}: {total / 2**20:.1f} MiB of wheels, over the {WHEEL_BUDGET / 2**20:.0f} MiB budget")


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_check_out", help="where the files that come back go (default: %(default)s)")
    p.add_argument("--device", default=None, help="cuda, or cpu for the rehearsal (default: cuda where there is one)")
    p.add_argument("--parts", default=",".join(x.name for x in PARTS),
                   help="comma-separated, run in this order (default: all): %(default)s")
    p.add_argument("--sizes", choices=("quick", "recipe"), default="quick",
                   help="on a GPU: quick (minutes), or recipe (docs/gpu.md's lengths; caps and budget x "
                        f"{RECIPE_SCALE}) (default: %(default)s)")
    p.add_argument("--budget", type=int, default=None, help=f"seconds for all parts (default: {BUDGET}; x "
                                                             f"{RECIPE_SCALE} with --sizes recipe)")
    p.add_argument("--cap-scale", type=float, default=None, help="each part's cap times this: a rehearsal on a slow "
                                                                  "or shared CPU (default: 1; "
                                                                  f"{RECIPE_SCALE} with --sizes recipe)")
    p.add_argument("--methods", default=",".join(STEP_METHODS), help="the steps part's (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--pytest-arg", dest="pytest_args", action="append", default=[],
                   help="passed to the tests part's pytest, e.g. --pytest-arg=-x (repeatable)")
    p.add_argument("--fetch-wheels", action="store_true", help=f"download {os.path.relpath(WHEELS, ROOT)} into .whl/")
    p.add_argument("--check-wheels", action="store_true",
                   help="say in one line whether .whl/ holds a stale or second wheel (gpu_check.sh, before installing)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # a child: one part
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)  # the children's shared folder
    a = p.parse_args(argv)
    # every value checked before anything is fetched, imported or started (a part's traceback would come minutes in)
    scale = RECIPE_SCALE if a.sizes == "recipe" else 1
    a.budget = BUDGET * scale if a.budget is None else a.budget
    a.cap_scale = float(scale) if a.cap_scale is None else a.cap_scale
    if a.budget < 1:
        p.error(f"--budget {a.budget}: must be at least 1 second")
    if not (math.isfinite(a.cap_scale) and a.cap_scale > 0):
        p.error(f"--cap-scale {a.cap_scale}: must be a number above 0")
    if a.threads is not None and not 1 <= a.threads <= (os.cpu_count() or 1):
        p.error(f"--threads {a.threads}: must be at least 1 and at most this machine's {os.cpu_count()} CPUs")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        p.error(f"--out {a.out}: a file, not a folder; name a folder (it is made where missing)")
    if not [x for x in a.parts.split(",") if x]:
        p.error(f"--parts {a.parts!r}: names no part (choose from {', '.join(RUNNERS)})")
    if not [m for m in a.methods.split(",") if m]:
        p.error(f"--methods {a.methods!r}: names no method")
    if a.check_wheels:
        return 1 if print_problem(wheel_problem()) else 0
    if a.fetch_wheels:
        return fetch_wheels()
    import torch
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: no CUDA device is visible")
    a.methods = [m for m in a.methods.split(",") if m]
    a.parts = [x for x in a.parts.split(",") if x]
    for x in a.parts:
        if x not in RUNNERS:
            p.error(f"--parts: unknown part {x!r} (choose from {', '.join(RUNNERS)})")
    import methods
    for m in a.methods:
        if m not in methods.names():
            p.error(f"--methods: unknown method {m!r}")
    if a.part:
        return run_part(a)
    report = check(a)
    bad = [x for x in report["parts"] if x.get("status") != "ok"]
    for x in report["parts"]:
        print(f"{x['name']:8s} {x.get('status', '?'):24s} {x.get('seconds', '')}")
    print(f"gpu_check: {len(report['parts']) - len(bad)} of {len(report['parts'])} parts ok in "
          f"{report['seconds']:.0f} s on {report['name']}; {os.path.join(a.out, 'gpu_check.json')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
