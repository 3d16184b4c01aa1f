import sys

from ukjax.cli import main

sys.exit(main(["run", "spiral", *sys.argv[1:]]))
