"""`ukjax run spiral` as a script: figures and metrics.json in --out (default
./ukjax-results/spiral; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "spiral", *sys.argv[1:]]))
