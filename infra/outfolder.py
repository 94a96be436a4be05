"""An output folder that a tool continues into (tools.attribution's --out, tools.compare's --out), kept to one set of
settings, as train.py keeps RUN_DIR with run.json and --resume:

    OUT/settings.json   the settings that define the results in OUT, written when OUT is claimed
    OUT/.lock           held (flock, infra/files.py) while the tool writes there

Why: a tool that continues into OUT appends new results to the old ones. Results made with another seed, model or
sample size would be counted as if one run made them all, under the new command's header; two tools writing at once
would each append the same lines. So a continuation with other settings is refused in one line naming the setting
and the way out (--overwrite, or another --out), and a second writer is refused while the first holds the lock.
"""
import json
import os
import sys

from infra import files

SETTINGS = "settings.json"


def comparable(value):
    """value as settings.json gives it back (tuples become lists, paths strings): what a recorded value is compared
    with."""
    return json.loads(json.dumps(value, default=str))


def mismatch(recorded: dict, settings: dict):
    """The first setting whose value differs between what OUT recorded and this command, as (name, old, new), or
    None. A setting this command has that the record lacks counts as different (a record of an older version)."""
    for key, value in comparable(settings).items():
        if key not in recorded or recorded[key] != value:
            return key, recorded.get(key, "(not recorded)"), value
    return None


def shown(value, other) -> str:
    """A recorded value as the refusal says it: a file's identity by its name, or where both name the same file, by
    its checksums (its contents changed in place)."""
    if not isinstance(value, dict) or "name" not in value:
        return str(value)
    if isinstance(other, dict) and other.get("name") == value["name"]:
        return f"{value['name']} (SHA-256 {json.dumps(value.get('sha256'), sort_keys=True)[:60]}...)"
    return str(value["name"])


def claim(out: str, settings: dict, overwrite: bool, holds_results: bool, flag: str = "--out", clear=()):
    """Make OUT this command's: take its lock (one line if another process holds it), refuse results made with other
    settings (or with none recorded: holds_results says whether OUT already holds results), and on --overwrite
    remove the files named in `clear` (the tool's own, nothing else), then record `settings`. Returns the lock's open
    file, to keep open while writing (the kernel releases it when the process ends, however it ends)."""
    if os.path.exists(out) and not os.path.isdir(out):
        sys.exit(f"{flag} {out}: a file, not a folder; choose another {flag}")
    try:
        os.makedirs(out, exist_ok=True)
        lock = files.lock(out)
    except OSError as e:
        sys.exit(f"{flag} {out}: cannot write there ({e.strerror or e})")
    if lock is None:
        sys.exit(f"{flag} {out}: another process is writing there now; wait for it, or choose another {flag}")
    try:
        path = os.path.join(out, SETTINGS)
        recorded = read(path)
        if not overwrite:
            if recorded is None and holds_results:
                sys.exit(f"{flag} {out}: holds results whose settings were not recorded ({path} is missing or "
                         f"damaged): start over with --overwrite, or choose another {flag}")
            why = mismatch(recorded, settings) if recorded is not None else None
            if why:
                name, old, new = why
                sys.exit(f"{flag} {out}: holds results made with {name} {shown(old, new)}, not {shown(new, old)}: "
                         f"continue with the same setting, start over with --overwrite, or choose another {flag}")
        else:
            for name in clear:
                if os.path.isfile(os.path.join(out, name)):
                    os.remove(os.path.join(out, name))
        write(path, settings, flag)
    except SystemExit:  # refused: the lock goes now, not when the caller's frames are collected
        lock.close()
        raise
    return lock


def read(path: str):
    """settings.json's mapping, or None where it is missing, not JSON or not a mapping."""
    recorded = files.read_json(path)
    return recorded if isinstance(recorded, dict) else None


def write(path: str, settings: dict, flag: str):
    """settings.json written whole or not at all (a kill while writing leaves the old one)."""
    try:
        files.write_json(path, comparable(settings), indent=1)
    except OSError as e:
        sys.exit(f"{flag} {os.path.dirname(path)}: cannot write {os.path.basename(path)} ({e.strerror or e})")
