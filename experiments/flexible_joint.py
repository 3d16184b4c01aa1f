"""`ukjax run flexible_joint` as a script: figures and metrics.json in --out (default
./ukjax-results/flexible_joint; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "flexible_joint", *sys.argv[1:]]))
