"""The command-line parser every command of the project builds (train.py, evaluate.py, data.py, tools/*).

A refused flag is one line, `PROG: error: WHY (PROG --help lists the flags)`: argparse's usage above it is 35 lines
for train.py, and the line that says what is wrong scrolls away under it.

Why not argparse.ArgumentParser as it is: it takes any unambiguous abbreviation of a long flag (`--conf` for
`--config`), which only argparse understands: a recipe's loader, compare.py's list of the flags it sets itself and
any other reader of the command line would not see it, and the run would record one thing and do another."""
import argparse


class OneLine:
    """Abbreviations off (a flag is taken only as it is spelled in --help) and errors in one line, for any subclass
    of argparse's parser (TRL's HfArgumentParser too). refused: the last error's own text, for a caller that words
    it itself (config/shared.parse_quietly)."""
    refused = None

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.refused = message
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


class Parser(OneLine, argparse.ArgumentParser):
    """argparse's parser, OneLine."""


class Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default, except where it is None: a rule's knob is None until its rule's default
    fills it (methods.Knob), and its help says that default itself."""
    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)
