import sys

from ukjax.cli import main

sys.exit(main(["run", "flexible_joint", *sys.argv[1:]]))
