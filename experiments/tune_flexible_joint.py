"""`ukjax tune flexible_joint`: history, figures and metrics.json in --out
(default ukjax-results/tune_flexible_joint)."""

import sys

from ukjax.cli import main

sys.exit(main(["tune", "flexible_joint", *sys.argv[1:]]))
