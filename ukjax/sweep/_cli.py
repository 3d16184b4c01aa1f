"""``ukjax sweep SPEC``: run (or resume) a sweep from a TOML spec or a shipped spec's name, then write its
report; ``ukjax sweep --list`` names the shipped specs."""

from __future__ import annotations

import argparse

DESCRIPTION = "run a Monte-Carlo sweep from a TOML spec (resumable, every device, many hosts) and report it"

EPILOG = """\
examples:
  ukjax sweep --list                                            # the shipped specs and their folder
  ukjax sweep scara                                             # run or resume a shipped spec, then report
  ukjax sweep scara --scenarios 2048                            # a smaller run of the same spec
  ukjax sweep my_sweep.toml                                     # a spec file of your own
  ukjax sweep --report ukjax-results/sweep_scara                # redraw the report of a result folder
  srun --ntasks=4 --gpus-per-task=1 ukjax sweep SPEC --distributed   # SLURM: 4 processes share the chunks

Results: one Parquet file per chunk in OUT/chunks/, OUT/manifest.json, OUT/report/. A run that is stopped
resumes where it stopped when started again with the same spec and --out; every chunk is verified first
(damaged ones are computed again), and a folder holding another sweep (spec, seed, model code or versions
changed) is refused. One run at a time per folder.
"""


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "sweep",
        help=DESCRIPTION,
        description=DESCRIPTION[0].upper() + DESCRIPTION[1:] + ".",
        epilog=EPILOG + "\nshipped specs (ukjax sweep NAME):\n" + shipped_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "spec",
        nargs="?",
        help="a sweep spec: a TOML file, or the name of a shipped spec (`ukjax sweep --list`), e.g. scara",
    )
    parser.add_argument(
        "--list", action="store_true", help="name the shipped specs and the folder that holds them, then exit"
    )
    parser.add_argument(
        "--out", help="output folder (default: the spec's out, else ukjax-results/sweep_NAME)"
    )
    parser.add_argument("--scenarios", type=int, help="override the spec's number of scenarios per grid cell")
    parser.add_argument("--chunk-size", type=int, help="override the spec's chunk size")
    parser.add_argument("--seed", type=int, help="override the spec's seed")
    parser.add_argument(
        "--devices", type=int,
        help="local devices to use (default: all; on a CPU-only machine one CPU device per core)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="discard earlier results in --out (default: resume)"
    )
    parser.add_argument(
        "--allow-version-change",
        action="store_true",
        help="resume a sweep begun with other versions of ukjax, JAX or its libraries (refused otherwise)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-report", action="store_true", help="do not write the report after the run")
    parser.add_argument("--report", metavar="DIR", help="only (re)draw the report of the sweep in DIR")
    many = parser.add_argument_group("many hosts (jax.distributed)")
    many.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process run, the cluster auto-detected (SLURM and the others JAX knows)",
    )
    many.add_argument("--coordinator", metavar="HOST:PORT", help="explicit coordinator address (process 0's)")
    many.add_argument("--num-processes", type=int, help="with --coordinator: number of processes")
    many.add_argument("--process-id", type=int, help="with --coordinator: this process's id, 0..N-1")
    return parser


def initialize(args) -> None:
    """Join the multi-process run the flags ask for, or, in one process on a CPU-only machine, give the
    process one CPU device per core (``--devices D``: D of them; :func:`ukjax.use_cpu_cores`), which the
    sweep splits its chunks over (before any JAX computation; where JAX has started already, as when the
    command runs inside a Python program, its devices stay as they are).

    Why: a sweep on one CPU device keeps ~1.1 of 2 cores busy. Measured (``benchmarks/sweep.py``,
    ``results/sweep-amd-epyc-2c-session21.json``: 4096 SCARA scenarios x 200 Tsit5 steps, 2-core CPU, load
    1.6-2.1): 1.89 s on one device, 0.95 s on two."""
    if args.coordinator is not None or args.distributed:
        from ukjax.sweep import initialize_distributed

        initialize_distributed(args.coordinator, args.num_processes, args.process_id)
        return
    from ukjax._config import use_cpu_cores_if_starting

    if args.devices is None or args.devices >= 1:  # else the sweep names the error
        use_cpu_cores_if_starting(args.devices)


def shipped_table() -> str:
    """The shipped specs, one line each (name and description), and where their files are."""
    from ukjax.cli import _format_table
    from ukjax.sweep._spec import shipped_folder, shipped_specs

    return (
        _format_table(list(shipped_specs().items()))
        + f"\nfiles: {shipped_folder()} (copy one to change it, then `ukjax sweep FILE`)"
    )


def main(args) -> int:
    """Run the sweep (or only the report) the parsed ``args`` ask for. Bad input, a folder that does not
    prove its results (``ValueError``) and a file that cannot be read or written (``OSError``: read-only
    folder, disk full) propagate to :func:`ukjax.cli.main`, the one error path of the command line: one line
    naming the file, exit 2."""
    import jax

    from ukjax import sweep

    if args.list:
        print(shipped_table())
        return 0
    if args.report is not None:
        sweep.report(args.report)
        return 0
    if args.spec is None:
        raise ValueError(
            "give a spec file or a shipped spec's name (`ukjax sweep --list`), or --report DIR; "
            "see `ukjax sweep --help`"
        )
    spec = sweep.load_spec(args.spec, scenarios=args.scenarios, chunk_size=args.chunk_size, seed=args.seed)
    summary = sweep.run(
        spec,
        out=args.out,
        devices=args.devices,
        fresh=args.fresh,
        progress=not args.no_progress,
        allow_version_change=args.allow_version_change,
    )
    if jax.process_index() == 0:
        print(
            f"ukjax sweep {spec.name}: {summary.scenarios_written} scenarios in {summary.run_s:.1f} s "
            f"({summary.scenarios_per_s:.1f} scenarios/s; compile {summary.compile_s:.1f} s)"
        )
        if summary.complete and not args.no_report:
            sweep.report(summary.out)
    return 0
