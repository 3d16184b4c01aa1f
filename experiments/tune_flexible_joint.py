"""Tuning study `flexible_joint` (see ukjax/studies/tune_flexible_joint.py): the same as `ukjax tune flexible_joint`.

Writes history.json/csv, figures and metrics.json into --out (default ukjax-results/tune_flexible_joint); the committed
results/tune_flexible_joint/metrics.json came from `python experiments/tune_flexible_joint.py --out results/tune_flexible_joint`.
"""

import argparse

import ukjax
from ukjax.studies import tune_flexible_joint as study

if __name__ == "__main__":
    ukjax.enable_float64()
    parser = argparse.ArgumentParser(description=study.DESCRIPTION)
    study.add_arguments(parser)
    study.run(parser.parse_args())
