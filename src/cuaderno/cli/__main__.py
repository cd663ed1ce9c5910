"""``python -m cuaderno.cli``: the command line."""

from cuaderno.cli import main

main()
