import sys

from ukjax.cli import main

sys.exit(main(["run", "scara", *sys.argv[1:]]))
