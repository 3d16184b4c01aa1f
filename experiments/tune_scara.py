"""`ukjax tune scara` as a script: history, figures and metrics.json in --out (default
./ukjax-results/tune_scara; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "scara", *sys.argv[1:]]))
