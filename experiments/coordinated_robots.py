import sys

from ukjax.cli import main

sys.exit(main(["run", "coordinated_robots", *sys.argv[1:]]))
