import sys

from ukjax.cli import main

sys.exit(main(["run", "three_rrr", *sys.argv[1:]]))
