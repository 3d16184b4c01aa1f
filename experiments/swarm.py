"""`ukjax run swarm` as a script: figures and metrics.json in --out (default
./ukjax-results/swarm; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "swarm", *sys.argv[1:]]))
