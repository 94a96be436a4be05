"""Files that a kill cannot leave half-written, and a folder that one process writes at a time: the one helper for
each job, used by every writer (train.py's run folder through checkpoint.py, the tools' output folders through
outfolder.py, tools.compare, tools.attribution, tools.perf.gpu_check).

    write_json(path, obj)   whole or not at all: written beside, then renamed over (a kill leaves the old file)
    write_jsonl(path, rows) the same for a file of JSON lines rewritten whole (metrics.jsonl, rollouts.jsonl)
    write_tensors(path, obj) the same for torch.save's file (a rule's state beside a TRL checkpoint)
    write_text(path, text)  the same for a text file (docs/findings.md, remade by tools.findings_page)
    read_json(path)         the contents, or None where the file is missing or not JSON (a half-written file)
    lock(folder)            an exclusive flock on FOLDER/.lock, or None where another process holds it
"""
import json
import os


def write_json(path: str, obj, **dump):
    """A JSON file written whole or not at all: a kill while writing leaves the file before (or none), never a
    half-written one that read_json would take for missing. dump: json.dump's options (indent, default)."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, **dump)
    os.replace(path + ".tmp", path)


def write_jsonl(path: str, rows):
    """A file of JSON lines, one a row, rewritten whole or not at all, as write_json."""
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    os.replace(path + ".tmp", path)


def write_text(path: str, text: str):
    """A text file written whole or not at all, as write_json."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_tensors(path: str, obj):
    """torch.save's file written whole or not at all, as write_json."""
    import torch  # here, not above: the JSON helpers serve tools that load no torch
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def read_json(path: str):
    """A JSON file's contents, or None where it is missing or not JSON (a half-written file)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError):
        return None


def lock(folder: str):
    """FOLDER/.lock opened and locked (flock, exclusive): the open file, to keep open while writing there (the kernel
    drops the lock when the process ends, however it ends, so no stale lock remains), or None where another process
    holds it. Where there is no flock (Windows) the file comes back unlocked: one writer at a time is then up to the
    user. An OSError of opening (a folder that cannot be written) is the caller's to word."""
    f = open(os.path.join(folder, ".lock"), "a")
    try:
        import fcntl
    except ImportError:
        return f
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return None
    return f
