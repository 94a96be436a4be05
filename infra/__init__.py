"""What a run stands on but a reader of the papers need not open on the first day.

    models.py       which model --model means (the tiny one, packaged real ones, GGUF files, directories), loaded
    checkpoint.py   run directories that lose nothing: checkpoints, resume, run.json, metrics.jsonl, the lock
    logbook.py      what a step logs: its metrics line, first-error attribution, warnings, heat maps
    plots.py        token heat maps (HTML) and curves (PNG)
    memory.py       the --dry-run memory plan, and the peak memory a run logs
    fastpath.py     speed only: written-out forwards that tests prove equal to the model's own

Imports point down only: to toyworld/, never to the root's modules.
"""
