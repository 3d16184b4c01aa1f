"""`ukjax tune flexible_joint` as a script: history, figures and metrics.json in --out (default
./ukjax-results/tune_flexible_joint; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "flexible_joint", *sys.argv[1:]]))
