"""Commands that run train.py many times and print or draw numbers: compare.py (methods side by side over seeds),
bench.py (speed), memcheck.py (memory against the plan), check_eval.py (an independent grader). Run them as modules
from the repository's root, `python -m tools.compare`, as nanochat runs its scripts."""
