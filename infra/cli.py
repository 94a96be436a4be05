"""The command-line parser every command of the project builds (train.py, evaluate.py, data.py, tools/*).

Why not argparse.ArgumentParser as it is: it takes any unambiguous abbreviation of a long flag (`--conf` for
`--config`), which only argparse understands: a recipe's loader, compare.py's list of the flags it sets itself and
any other reader of the command line would not see it, and the run would record one thing and do another."""
import argparse


class Parser(argparse.ArgumentParser):
    """argparse's parser with abbreviations off: a flag is taken only as it is spelled in --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
