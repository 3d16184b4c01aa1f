"""``ukjax demo`` run twice with the same caches: a second process with the program cache (its compiled chunk
program loaded, ``ukjax._programs``) and with JAX's compilation cache only (``UKJAX_PROGRAM_CACHE=off``:
traced and lowered again, XLA's compilation read back).

Each round and contender: a new, empty cache folder, the demo as a user types it (default options: 1024 SCARA
scenarios of Xu & Liu 2017 in chunks of 256, Bosh3 at 5 ms for 5 s, the ``ukjax`` command's XLA flags), once
(``first``) and once more (``second``) in fresh processes; contenders interleaved, their order alternating
by round. Recorded: the demo's ``metrics.json`` timings (``compile``: trace, lower and compile, or read, its
chunk program), the process's wall time, the largest difference of the path-error statistics between the
contenders' second runs, the load average per run and ``uptime`` before and after.

    python3 benchmarks/demo_second_run.py               # 3 rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from demo_first_result import _numbers, run_demo  # noqa: E402

CONTENDERS = {"program_cache": {}, "compilation_cache_only": {"UKJAX_PROGRAM_CACHE": "off"}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "demo-second-run-cpu.json"))
    args = parser.parse_args(argv)
    from _common import write_results

    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    before = uptime()
    flags = os.environ.get("XLA_FLAGS", "")
    runs = {name: [] for name in CONTENDERS}
    for r in range(args.rounds):
        order = list(CONTENDERS) if r % 2 == 0 else list(CONTENDERS)[::-1]
        for name in order:
            folder = Path(tempfile.mkdtemp(prefix="ukjax-demo-second-"))
            pair = {}
            for run in ("first", "second"):
                pair[run] = run_demo(flags, folder, **CONTENDERS[name]) | {"load": os.getloadavg()[0]}
            runs[name].append(pair)
            print(f"round {r + 1} {name}: compile {pair['first']['compile_s']:.1f} s then "
                  f"{pair['second']['compile_s']:.2f} s; process {pair['first']['process_wall_s']:.1f} s "
                  f"then {pair['second']['process_wall_s']:.1f} s", flush=True)  # fmt: skip
    keys = [k for k in runs["program_cache"][0]["first"] if k.endswith("_s")]
    median = lambda pairs, run, k: statistics.median(p[run][k] for p in pairs)  # noqa: E731
    medians = {
        name: {run: {k: median(pairs, run, k) for k in keys} for run in ("first", "second")}
        for name, pairs in runs.items()
    }
    seconds = [runs[name][0]["second"]["path_error_m"] for name in CONTENDERS]
    difference = max(abs(a - b) for a, b in zip(_numbers(seconds[0]), _numbers(seconds[1]), strict=True))
    seconds_compile = {name: medians[name]["second"]["compile_s"] for name in CONTENDERS}
    ratio = seconds_compile["program_cache"] / seconds_compile["compilation_cache_only"]
    print(f"second run's compile, program cache / compilation cache only: {ratio:.2f}")
    write_results(
        args.out,
        {
            "description": "ukjax demo (default options) twice with the same caches, fresh processes: its "
            "compiled program loaded (program cache) or traced again (compilation cache only); the demo's "
            "own timings, medians over interleaved rounds",
            "config": vars(args),
            "uptime_before": before,
            "uptime_after": uptime(),
            "medians": medians,
            "second_run_compile_ratio": ratio,
            "max_path_error_statistic_difference_m": difference,
            "runs": runs,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
