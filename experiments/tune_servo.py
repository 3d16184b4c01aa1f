"""`ukjax tune servo` as a script: history, figures and metrics.json in --out (default
./ukjax-results/tune_servo; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "servo", *sys.argv[1:]]))
