"""``benchmarks/throughput.py --user --isolate``: each contender in its own process, the processes
interleaved, a process that does not finish in time killed, counted and started again. With JAX's default
XLA:CPU configuration the naive contender's batched LAPACK calls can wait on each other forever, so this is
how a default-configuration ratio is measured at all; a contender that never finished reports its hangs and
no rate (never a number from a run that did not happen)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def throughput():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import throughput

    return throughput


def run(throughput, tmp_path, *options):
    out = tmp_path / "user.json"
    common = ["--user", "--isolate", "--batch", "2", "--duration", "0.01", "--rounds", "1"]
    common += ["--solvers", "RK4"]
    payload = throughput.main([*common, "--profile", "0", "--out", str(out), *options])
    assert json.loads(out.read_text())["rows"] == json.loads(json.dumps(payload["rows"]))
    return payload


def test_a_hung_contender_is_killed_counted_and_reports_no_rate(throughput, tmp_path):
    # a time limit far below one process's start-up: every process counts as hung, is started once more
    payload = run(throughput, tmp_path, "--timeout-s", "0.2", "--retries", "1")
    (row,) = payload["rows"]
    assert {name: row[name] for name in throughput.USER_CONTENDERS} == {
        name: {"hung": 2, "runs": 0} for name in throughput.USER_CONTENDERS
    }
    assert not any(key.startswith("ukjax_over_naive") for key in row)
    assert "own process" in payload["description"]


@pytest.mark.slow
def test_isolated_contenders_measure_the_same_motion(throughput, tmp_path):
    payload = run(throughput, tmp_path, "--runs-per-process", "2", "--timeout-s", "600")
    (row,) = payload["rows"]
    for name in throughput.USER_CONTENDERS:
        assert row[name]["hung_processes"] == 0 and len(row[name]["run_s_rounds"]) == 2
        assert row[name]["scenario_steps_per_s"] > 0
        # the four programs integrate the same robot from the same states: 2 RK4 steps of 5 ms agree to
        # round-off (the closed form against automatic differentiation of the constraint)
        assert row[name]["max_state_difference_vs_ukjax_scara"] < 1e-9
    assert row["ukjax_over_naive_scara"] > 0 and row["ukjax_over_naive_user_scara"] > 0
