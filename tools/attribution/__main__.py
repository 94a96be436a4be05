"""python -m tools.attribution: the command of tools/attribution/__init__.py."""
from tools.attribution import main

main()
