"""``python -m gpudask.cli``."""

from gpudask.cli import main

main()
