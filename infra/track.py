"""--report-to: the run's records sent, as metrics.jsonl receives them, to trackers people watch live (TensorBoard,
Weights & Biases, trackio), plus at each evaluation a table of the step's sampled completions with their rewards.

metrics.jsonl stays the record this project reads; a tracker gets the same numbers under the same names, step by
step. Every tracker is an optional install (requirements/track.txt), imported only when asked for, and works
offline with its files under the run directory:

    tensorboard   RUN/tensorboard/events.out.tfevents.*       tensorboard --logdir RUN/tensorboard
    wandb         RUN/wandb/offline-run-*/ (mode offline)     wandb sync RUN/wandb/offline-run-*   (to upload)
    trackio       RUN/trackio/PROJECT.db (a SQLite store)     TRACKIO_DIR=RUN/trackio trackio show

--resume continues the same tracker run where the tracker allows it: TensorBoard adds an event file that its
reader merges, wandb reuses the run's id (offline, each session is a folder of its own that `wandb sync` joins),
trackio reopens the run by name. The steps after the checkpoint, logged again, appear twice in TensorBoard.
"""
import importlib.util
import json
import math
import os
import secrets
import tempfile

INSTALL = "pip install -r requirements/track.txt"
PROJECT = "critic-free-rl"


def keep_offline(run_dir: str):
    """Every tracker's files under run_dir, and wandb offline unless WANDB_MODE says otherwise: wandb otherwise
    writes to ~/.cache and ~/.local, trackio to ~/.cache/huggingface, TRL's TensorBoard to output_dir/runs/DATE.
    TRACKIO_DIR is read when trackio is first imported: one store a process."""
    os.environ["TENSORBOARD_LOGGING_DIR"] = os.path.join(run_dir, "tensorboard")
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"):
        os.environ[var] = os.path.join(run_dir, "wandb")
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_PROJECT", PROJECT)
    os.environ["TRACKIO_DIR"] = os.path.join(run_dir, "trackio")


def trackio_dir_first(argv: list, flag: str, default: str):
    """TRACKIO_DIR from the run folder a command line names, set before trackio can be imported (scaling/trl_train.py:
    TRL imports it with its trainer, and trackio reads the variable once)."""
    out = default
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            out = argv[i + 1]
        elif word.startswith(flag + "="):
            out = word.split("=", 1)[1]
    os.environ.setdefault("TRACKIO_DIR", os.path.join(out, "trackio"))


def check_trackio_dir():
    """trackio, once imported, writes to the store it found then: say so if that is not this run's."""
    import trackio.utils
    if os.path.abspath(trackio.utils.TRACKIO_DIR) != os.path.abspath(os.environ["TRACKIO_DIR"]):
        raise SystemExit(f"--report-to trackio: this process opened trackio's store at {trackio.utils.TRACKIO_DIR} "
                         f"already, and trackio keeps one store a process: run this one in a process of its own")


def numbers(record: dict) -> dict:
    """The record's finite numbers (a tracker plots numbers; null, text and lists stay in metrics.jsonl)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoard:
    package = "tensorboard"
    # what the tracker writes at the top of its folder (RUN/tensorboard): what --overwrite may delete there
    writes = ("events.out.tfevents.*",)

    def __init__(self, run_dir: str, name: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def log(self, record: dict):
        for k, v in numbers(record).items():
            self.writer.add_scalar(k, v, record["step"])
        self.writer.flush()  # a run watched live shows each step as it ends

    def table(self, step: int, columns: list, rows: list):
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731 (a Markdown table cell)
        text = "\n".join(["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
                         + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])
        self.writer.add_text("completions", text, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class StepLogged:
    """wandb and trackio alike: a dict of numbers logged at a step (send), a table as their Table class, finish."""

    def log(self, record: dict):
        self.send(numbers(record), step=record["step"])

    def table(self, step: int, columns: list, rows: list):
        self.send({"completions": self.Table(columns=columns, data=rows)}, step=step)


class Wandb(StepLogged):
    package = "wandb"
    writes = ("run-id", "wandb", "latest-run", "debug.log", "debug-internal.log", "offline-run-*", "run-*",
              "artifacts")

    def __init__(self, run_dir: str, name: str, config: dict):
        keep_offline(run_dir)
        import wandb
        os.makedirs(os.path.join(run_dir, "wandb"), exist_ok=True)
        id_file = os.path.join(run_dir, "wandb", "run-id")  # --resume continues the run of this id
        run_id = read_run_id(id_file)
        with open(id_file, "w") as f:
            f.write(run_id)
        run = wandb.init(project=PROJECT, name=name, id=run_id, resume="allow", dir=run_dir, config=config)
        self.send, self.Table, self.close = run.log, wandb.Table, run.finish


def read_run_id(id_file: str) -> str:
    """The wandb run id --resume continues, or a new one where there is none; an id file that is empty, damaged or
    unreadable is said in one line, and a new wandb run holds the curves from here (wandb's own error would be a
    traceback that ends the run)."""
    if not os.path.exists(id_file):
        return secrets.token_hex(4)
    try:
        with open(id_file, encoding="utf-8") as f:
            run_id = f.read().strip()
    except (OSError, ValueError) as e:
        run_id, why = "", getattr(e, "strerror", None) or type(e).__name__
    else:
        why = "empty" if not run_id else "not a wandb run id"
    if run_id and len(run_id) <= 64 and all(c.isalnum() or c in "-_" for c in run_id):
        return run_id
    print(f"--report-to wandb: {id_file}: {why}; this run's curves go on in a new wandb run")
    return secrets.token_hex(4)


class Trackio(StepLogged):
    package = "trackio"
    # the store of PROJECT (.db, -wal, -shm, .lock, .hash, parquet exports) and trackio's folders beside it
    writes = (f"{PROJECT}.*", f"{PROJECT}_*", "media", "artifacts", "traces", "aux")

    def __init__(self, run_dir: str, name: str, config: dict):
        keep_offline(run_dir)
        import trackio
        check_trackio_dir()
        trackio.init(project=PROJECT, name=name, config=config, resume="allow", embed=False, auto_log_cpu=False)
        self.send, self.Table, self.close = trackio.log, trackio.Table, trackio.finish


TRACKERS = {"tensorboard": TensorBoard, "wandb": Wandb, "trackio": Trackio}


def names(text: str) -> list:
    """--report-to's value as tracker names: "none", or names joined by commas."""
    return [] if text.strip() == "none" else [t.strip() for t in text.split(",") if t.strip()]


def problem(text: str):
    """Why --report-to TEXT cannot be honoured (an unknown name, a tracker not installed), or None: said in one line
    before the model loads."""
    for name in names(text):
        if name not in TRACKERS:
            return f"--report-to {text}: {name!r} is not one of none, {', '.join(TRACKERS)}"
        if importlib.util.find_spec(TRACKERS[name].package) is None:
            return f"--report-to {name}: the {TRACKERS[name].package} package is not installed: {INSTALL}"
    return None


def folder_problem(text: str, run_dir: str):
    """Why a tracker of --report-to TEXT could not write its folder under run_dir (a file there, a folder that takes
    no file), or None: said in one line before the model loads."""
    for name in names(text):
        folder = os.path.join(run_dir, name)
        if os.path.exists(folder) and not os.path.isdir(folder):
            return f"--report-to {name}: {folder} is a file where the tracker keeps a folder; move it away"
        if os.path.isdir(folder):
            try:
                with tempfile.TemporaryFile(dir=folder):
                    pass
            except OSError as e:
                return f"--report-to {name}: {folder} cannot be written ({e.strerror or e})"
    return None


class Trackers:
    """The trackers --report-to names, started once the run directory is the run's; each call goes to all. A tracker
    that fails (a full disk, a folder made read-only, the tracker's own error) never ends the run: one line says
    which and that training goes on without it; metrics.jsonl keeps every record."""

    def __init__(self, text: str, run_dir: str, config: dict):
        self.all = []
        for n in names(text):
            self.guarded(n, lambda: self.all.append(TRACKERS[n](run_dir, os.path.basename(os.path.abspath(run_dir)),
                                                                config)))

    def guarded(self, name: str, call, tracker=None):
        try:
            call()
        except SystemExit:  # a refusal of our own (trackio's store), made before the model loads
            raise
        except Exception as e:
            if tracker in self.all:
                self.all.remove(tracker)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(f"--report-to {name}: failed ({type(e).__name__}: {first}); training goes on without it "
                  f"(metrics.jsonl keeps every record)", flush=True)

    def log(self, record: dict):
        for t in list(self.all):
            self.guarded(t.package, lambda: t.log(record), t)

    def table(self, step: int, columns: list, rows: list):
        for t in list(self.all):
            self.guarded(t.package, lambda: t.table(step, columns, rows), t)

    def close(self):
        for t in list(self.all):
            self.guarded(t.package, t.close, t)
