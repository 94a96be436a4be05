"""Research tools, run as modules from the repository's root (`python -m tools.compare`, as nanochat runs its
scripts): compare.py (methods side by side over seeds), paired.py (the paired answer of a comparison),
attribution/ (every rule's blame against the first wrong step), check_eval.py (an independent grader), merge.py (a
LoRA checkpoint merged), findings.py (the findings' numbers that paired.py does not print) and findings_page.py
(docs/findings.md filled from the archives, its template findings_page.md). Speed and memory are perf/'s: `python -m tools.perf.bench`, `python -m tools.perf.gpu_check`."""
