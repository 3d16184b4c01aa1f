"""`ukjax tune scara`: history, figures and metrics.json in --out
(default ukjax-results/tune_scara)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "scara", *sys.argv[1:]]))
