"""`ukjax tune ur5` as a script: history, figures and metrics.json in --out (default
./ukjax-results/tune_ur5; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "ur5", *sys.argv[1:]]))
