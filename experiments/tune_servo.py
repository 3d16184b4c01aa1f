"""Tuning study `servo` (see ukjax/studies/tune_servo.py): the same as `ukjax tune servo`.

Writes history.json/csv, figures and metrics.json into --out (default ukjax-results/tune_servo); the committed
results/tune_servo/metrics.json came from `python experiments/tune_servo.py --out results/tune_servo`.
"""

import argparse

import ukjax
from ukjax.studies import tune_servo as study

if __name__ == "__main__":
    ukjax.enable_float64()
    parser = argparse.ArgumentParser(description=study.DESCRIPTION)
    study.add_arguments(parser)
    study.run(parser.parse_args())
