"""`ukjax run scara` as a script: figures and metrics.json in --out (default
./ukjax-results/scara; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "scara", *sys.argv[1:]]))
