"""Speed and memory: how fast and how large, never what a method learns. bench.py (speed against model.generate, TRL
and the machine's limits; its parts in benchparts/), gpu_check.py (the one GPU check; gpu_check.sh runs it on a
machine without a package index), profile_step.py (a training pass under torch.profiler), memcheck.py (the
--dry-run plan against measured peaks), memgrowth.py (resident memory over repeated sampling calls)."""
