import sys

from ukjax.cli import main

sys.exit(main(["run", "five_bar", *sys.argv[1:]]))
