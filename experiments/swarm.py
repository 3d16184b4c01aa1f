import sys

from ukjax.cli import main

sys.exit(main(["run", "swarm", *sys.argv[1:]]))
