"""The command line: training.py holds train.py's flags and their presets, shared.py what every script shares."""
