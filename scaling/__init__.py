"""Scaling out: the same --method inside TRL's GRPOTrainer, on one process or many (README.md beside this file).
Optional: needs requirements/trl.txt. Not named `trl`, which would shadow the package."""
