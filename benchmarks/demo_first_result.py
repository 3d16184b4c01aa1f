"""``ukjax demo`` in a fresh process with XLA:CPU's fusion emitters (JAX's default) and with its legacy
elemental emitters (what ``ukjax demo`` sets, ``ukjax.faster_cpu_compilation``): the demo's own timings.

Each run is the command a user types (``python3 -m ukjax.cli demo --out DIR --no-progress``, default
options: 1024 SCARA scenarios of Xu & Liu 2017 in chunks of 256, Bosh3 at 5 ms for 5 s) in a fresh process
with an empty compilation cache (``UKJAX_CACHE_DIR`` a new folder), contenders interleaved round by round:
``fusion_emitters`` (``XLA_FLAGS=--xla_cpu_use_fusion_emitters=true``, which the command then leaves alone),
``elemental_emitters`` (``XLA_FLAGS`` unset: the command adds ``--xla_cpu_use_fusion_emitters=false``; the
command as users run it) and ``elemental_python_gc`` (the same with Python's own garbage-collector settings:
the command without ``ukjax._config.fewer_garbage_collections``, as it ran before that); with ``--before
TREE``, ``before``: the command as users run it from a checkout of an earlier commit (``PYTHONPATH=TREE``).
Recorded per run: the demo's ``metrics.json`` timings (compile: trace, lower and XLA-compile the chunk
program; integrate: the four chunks; postprocess; total) and the process's wall time; per contender the
medians; and the largest difference of the path-error statistics between the contenders (the same scenarios,
the same program up to XLA's code generation). ``uptime`` before and after goes to the JSON.

    python3 benchmarks/demo_first_result.py               # 3 rounds
    python3 benchmarks/demo_first_result.py --rounds 2
    git worktree add /tmp/before HEAD~1
    python3 benchmarks/demo_first_result.py --contenders elemental_emitters --before /tmp/before --rounds 5
    python3 benchmarks/demo_first_result.py --contenders elemental_emitters --tree one_program=/tmp/one
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTENDERS = {  # name: (XLA_FLAGS, with Python's own collector settings, ukjax's tree: None = installed)
    "fusion_emitters": ("--xla_cpu_use_fusion_emitters=true", False, None),
    "elemental_emitters": ("", False, None),
    "elemental_python_gc": ("", True, None),
}
PYTHON_GC = (
    "import sys, ukjax._config as c; c.fewer_garbage_collections = lambda: None; "
    "from ukjax.cli import main; sys.exit(main(sys.argv[1:]))"
)
"""The ``ukjax`` command with Python's own garbage-collector settings (contender ``elemental_python_gc``)."""


def run_demo(flags: str, folder: Path | None = None, python_gc: bool = False, tree: str | None = None,
             **env_extra: str) -> dict:  # fmt: skip
    """One ``ukjax demo`` in a fresh process with ``XLA_FLAGS=flags`` and the caches in ``folder`` (a new,
    empty one by default; a folder of an earlier run to measure a second run), ``env_extra`` in its
    environment, ukjax imported from ``tree`` (a checkout of another commit; default: the installed one);
    its timings. It runs in ``folder``: ``python -m`` puts its working directory first on ``sys.path``, so a
    run from a checkout would import that checkout's ukjax, not ``tree``'s."""
    folder = Path(tempfile.mkdtemp(prefix="ukjax-demo-bench-")) if folder is None else folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(XLA_FLAGS=flags, UKJAX_CACHE_DIR=str(folder / "cache"), **env_extra)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    tic = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *(["-c", PYTHON_GC] if python_gc else ["-m", "ukjax.cli"]), "demo",
         "--out", str(folder / "out"), "--no-progress", "--overwrite"],
        capture_output=True, text=True, env=env, cwd=folder,
    )  # fmt: skip
    wall = time.perf_counter() - tic
    if done.returncode != 0:
        raise RuntimeError(f"ukjax demo failed ({flags!r}): {done.stderr[-2000:]}")
    metrics = json.loads((folder / "out" / "metrics.json").read_text())
    return {
        **{f"{k}_s": v for k, v in metrics["timing_s"].items()},
        "process_wall_s": wall,
        "path_error_m": metrics["path_error_m"],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "demo-first-result-cpu.json"))
    parser.add_argument(
        "--before", metavar="TREE", help="also run the command as users run it (elemental emitters) from "
        "TREE, a checkout of an earlier commit (git worktree add TREE COMMIT): contender 'before'"
    )  # fmt: skip
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=TREE", help="like --before, a contender NAME "
        "that runs the command from TREE (repeatable)"
    )  # fmt: skip
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma list of {', '.join(CONTENDERS)}"
    )
    args = parser.parse_args(argv)
    contenders = {name: CONTENDERS[name] for name in args.contenders.split(",") if name}
    if args.before:
        contenders["before"] = ("", False, args.before)
    for item in args.tree:
        name, _, tree = item.partition("=")
        contenders[name] = ("", False, tree)
    sys.path.insert(0, str(HERE))
    from _common import write_results

    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    before = uptime()
    runs = {name: [] for name in contenders}
    for r in range(args.rounds):
        order = list(contenders) if r % 2 == 0 else list(contenders)[::-1]
        for name in order:
            flags, python_gc, tree = contenders[name]
            runs[name].append(run_demo(flags, python_gc=python_gc, tree=tree) | {"load": os.getloadavg()[0]})
            row = runs[name][-1]
            print(f"round {r + 1} {name}: compile {row['compile_s']:.1f} s, integrate "
                  f"{row['integrate_s']:.2f} s, total {row['total_s']:.1f} s, process "
                  f"{row['process_wall_s']:.1f} s", flush=True)  # fmt: skip
    keys = [k for k in next(iter(runs.values()))[0] if k.endswith("_s")]
    medians = {
        name: {k: statistics.median(run[k] for run in rows) for k in keys} for name, rows in runs.items()
    }
    firsts = [rows[0]["path_error_m"] for rows in runs.values()]
    difference = max(
        abs(a - b) for other in firsts[1:] for a, b in zip(_numbers(firsts[0]), _numbers(other), strict=True)
    ) if len(firsts) > 1 else 0.0  # fmt: skip

    def over(a, b):
        return {k: medians[a][k] / medians[b][k] for k in keys} if {a, b} <= set(runs) else None

    ratios = over("elemental_emitters", "fusion_emitters")
    gc_ratios = over("elemental_emitters", "elemental_python_gc")
    before_ratios = over("elemental_emitters", "before")
    for text, found in (("elemental / fusion", ratios), ("fewer collections / Python's", gc_ratios),
                        ("this tree / before", before_ratios)):  # fmt: skip
        if found:
            print(f"{text}:", {k: round(v, 2) for k, v in found.items()})
    write_results(
        args.out,
        {
            "description": "ukjax demo (default options: 1024 SCARA scenarios in chunks of 256, Bosh3, 5 ms, "
            "5 s) in fresh processes with an empty compilation cache: XLA:CPU fusion emitters vs legacy "
            "elemental emitters, and the command with Python's own garbage-collector settings; the demo's "
            "own timings, medians over interleaved rounds",
            "config": vars(args),
            "uptime_before": before,
            "uptime_after": uptime(),
            "medians": medians,
            "elemental_over_fusion": ratios,
            "fewer_gc_over_python_gc": gc_ratios,
            "this_tree_over_before": before_ratios,
            "before_tree": args.before,
            "max_path_error_statistic_difference_m": difference,
            "runs": runs,
        },
    )
    print(f"wrote {args.out}")


def _numbers(tree) -> list[float]:
    """Every number in a nested dict/list, in order."""
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in _numbers(v)]
    return [float(tree)] if isinstance(tree, int | float) else []


if __name__ == "__main__":
    main()
