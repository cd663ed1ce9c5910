"""``python -m cuaderno``: the command line."""

from cuaderno.cli import main

main()
