"""`ukjax run three_rrr` as a script: figures and metrics.json in --out (default
./ukjax-results/three_rrr; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "three_rrr", *sys.argv[1:]]))
