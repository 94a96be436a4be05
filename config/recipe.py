"""--config FILE: a recipe, the flags of a run as YAML keys (the flag's name with `-` or `_`), as TRL's `--config`
and open-r1's recipes/ take them; flags on the command line win. A run's run.json is a recipe too: its settings
repeat the run (where it ran, --resume, --overwrite and --dry-run are not repeated).

    # recipes/smollm2-arith.yaml
    model: smollm2-135m
    dataset: arith
    max-new-tokens: 40
    bf16: false        # a switch: true gives --bf16, false --no-bf16 (or nothing, for a flag that is off by default)

An unknown key, a value of the wrong kind or one the flag refuses is one line naming the file, the key and why.
"""
import argparse
import json

import yaml

import methods
from config import shared
from config.shared import Refused

# what a run.json holds beside the flags that made the run: resolve()'s derived values, and the run's place and
# mode, which a repeat does not inherit (it would land in, resume or delete the run it copies)
DERIVED = ("base", "rule", "term", "reference", "rules_file_sha256")
NOT_REPEATED = ("run_dir", "resume", "overwrite", "dry_run", "config")


def read(path: str) -> dict:
    """The recipe's keys and values; a run.json gives its settings. A file that is missing, not YAML or not a
    mapping is Refused in one line."""
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f)
    except OSError as e:
        raise Refused(f"--config {path}: cannot be read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        raise Refused(f"--config {path}: not YAML ({getattr(e, 'problem', None) or e}"
                      + (f", line {where.line + 1})" if where else ")")) from None
    if isinstance(values, dict) and isinstance(values.get("args"), dict) and "method" in values:  # a run.json
        # and not the knobs of rules other than its own (methods.Knob): filled in with their defaults, they would be
        # refused as given to a method that does not read them
        foreign = methods.owned_elsewhere(values["args"]["rule"], values["args"].get("term")) \
            if values["args"].get("rule") in methods.RULES else set()
        values = {k: v for k, v in values["args"].items() if k not in DERIVED + NOT_REPEATED and k not in foreign}
    if not isinstance(values, dict):
        raise Refused(f"--config {path}: a recipe is a mapping of flags to values (key: value lines), not "
                      f"{type(values).__name__}")
    return values


def tokens(action: argparse.Action, key: str, value, path: str) -> list:
    """One key's value as the command-line words of its flag."""
    flag = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:  # a switch
        if not isinstance(value, bool):
            raise Refused(f"--config {path}: {key}: {value!r} is not true or false (a switch)")
        if isinstance(action, argparse.BooleanOptionalAction):
            return [flag if value else "--no-" + flag[2:]]
        return [flag] if value else []
    if isinstance(value, (dict, list, bool)):
        raise Refused(f"--config {path}: {key}: {json.dumps(value)} is not a value {flag} takes")
    return [flag, str(value)]


def argv_of(p: argparse.ArgumentParser, path: str) -> list:
    """The recipe at path as command-line words for p, each key checked alone against its flag (a bad one is Refused
    naming the file and the key). Keys with a null value are left out: the flag keeps its default."""
    flags = {}
    for a in p._actions:
        if not a.option_strings or a.dest == "help":
            continue
        flags[a.dest] = a
        # and each of its long names: an alias keeps a recipe or run.json written under it (a flag renamed, its old
        # name kept: --gpu-memory for --memory) working; a switch's --no- form is not the switch
        for name in a.option_strings:
            if name.startswith("--") and not (isinstance(a, argparse.BooleanOptionalAction) and
                                              name.startswith("--no-")):
                flags.setdefault(name[2:].replace("-", "_"), a)
    words = []
    for key, value in read(path).items():
        action = flags.get(str(key).replace("-", "_"))
        if action is None:
            raise Refused(f"--config {path}: {key}: not a flag of this command (see its --help)")
        if action.dest == "config":
            raise Refused(f"--config {path}: {key}: a recipe cannot name another recipe")
        if value is None:
            continue
        said = tokens(action, key, value, path)
        try:
            shared.parse_quietly(p, said)  # the flag's own type and choices, alone
        except Refused as e:
            raise Refused(f"--config {path}: {key}: {e}") from None
        words += said
    return words


def expand(p: argparse.ArgumentParser, argv: list) -> list:
    """argv with --config FILE's flags put first, so that the command line's own flags, read later, win. A recipe is
    applied whole or refused: two --config (argparse would record the last, this applied the first), and a run's
    run.json under another --method (its values hold the other method's presets, which would stay without a word)."""
    given = [(i, argv[i + 1] if word == "--config" else word.split("=", 1)[1]) for i, word in enumerate(argv)
             if word == "--config" and i + 1 < len(argv) or word.startswith("--config=")]
    if len(given) > 1:
        raise Refused(f"--config given {len(given)} times ({', '.join(f for _, f in given)}): one recipe a run; put "
                      f"the other's flags on the command line")
    if not given:
        return argv
    path = given[0][1]
    method = run_method(path)
    for i, word in enumerate(argv):
        other = argv[i + 1] if word == "--method" and i + 1 < len(argv) else \
            word.split("=", 1)[1] if word.startswith("--method=") else None
        if method is not None and other is not None and same_method(other) != same_method(method):
            raise Refused(f"--config {path}: a run of --method {method}, whose settings hold that method's presets; "
                          f"--method {other} would keep them: repeat the run without --method, or start from a "
                          f"recipe (recipes/*.yaml)")
    return argv_of(p, path) + argv


def same_method(name: str):
    """A --method as (base, rule, term) (ktae is grpo+ktae); a name methods does not know, as it is (argparse refuses it)."""
    try:
        return methods.parse(name)
    except ValueError:
        return name


def run_method(path: str):
    """The method of a run.json (its "method"), or None where the file is a recipe or unreadable (read() says)."""
    try:
        with open(path, encoding="utf-8") as f:
            values = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    is_run = isinstance(values, dict) and isinstance(values.get("args"), dict) and "method" in values
    return values["method"] if is_run else None
