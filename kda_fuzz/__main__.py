"""``python -m kda_fuzz`` runs the command line."""

import sys

from kda_fuzz.cli import main

sys.exit(main())
