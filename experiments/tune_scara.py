"""Tuning study `scara` (see ukjax/studies/tune_scara.py): the same as `ukjax tune scara`.

Writes history.json/csv, figures and metrics.json into --out (default ukjax-results/tune_scara); the committed
results/tune_scara/metrics.json came from `python experiments/tune_scara.py --out results/tune_scara`.
"""

import argparse

import ukjax
from ukjax.studies import tune_scara as study

if __name__ == "__main__":
    ukjax.enable_float64()
    parser = argparse.ArgumentParser(description=study.DESCRIPTION)
    study.add_arguments(parser)
    study.run(parser.parse_args())
