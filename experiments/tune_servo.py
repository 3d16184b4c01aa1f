"""`ukjax tune servo`: history, figures and metrics.json in --out
(default ukjax-results/tune_servo)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "servo", *sys.argv[1:]]))
