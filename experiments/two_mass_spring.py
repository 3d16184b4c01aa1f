"""`ukjax run two_mass_spring` as a script: figures and metrics.json in --out (default
./ukjax-results/two_mass_spring; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "two_mass_spring", *sys.argv[1:]]))
