"""`ukjax run five_bar` as a script: figures and metrics.json in --out (default
./ukjax-results/five_bar; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "five_bar", *sys.argv[1:]]))
