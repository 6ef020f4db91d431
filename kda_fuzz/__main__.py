"""``python -m kda_fuzz`` runs the command line."""

from kda_fuzz.cli import console

console()
