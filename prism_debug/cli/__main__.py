"""``python -m prism_debug.cli``."""

from prism_debug.cli import main

main()
