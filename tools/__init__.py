"""Commands that run train.py many times and print or draw numbers: compare.py (methods side by side over seeds)
and bench.py (speed). Run them as files, `python tools/compare.py`, from anywhere."""
