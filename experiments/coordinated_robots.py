"""`ukjax run coordinated_robots` as a script: figures and metrics.json in --out (default
./ukjax-results/coordinated_robots; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "coordinated_robots", *sys.argv[1:]]))
