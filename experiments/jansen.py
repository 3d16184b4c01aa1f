"""`ukjax run jansen` as a script: figures and metrics.json in --out (default
./ukjax-results/jansen; a folder that already holds results needs --overwrite)."""

import sys

from ukjax.cli import main

sys.exit(main(["run", "jansen", *sys.argv[1:]]))
