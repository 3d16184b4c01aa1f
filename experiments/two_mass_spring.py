import sys

from ukjax.cli import main

sys.exit(main(["run", "two_mass_spring", *sys.argv[1:]]))
