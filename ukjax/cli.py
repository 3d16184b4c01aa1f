"""The ``ukjax`` command: ``ukjax list``, ``ukjax run NAME [flags]``, ``ukjax tune NAME [flags]``,
``ukjax sweep SPEC [flags]`` and ``ukjax demo [flags]``."""

from __future__ import annotations

import argparse
import sys

from ukjax import studies

EXIT_USAGE = 2


def _study_table(registry=None, load=None) -> list[tuple[str, str]]:
    """(name, one-line description) of every registered study (or tuning study), in name order."""
    registry = studies.STUDIES if registry is None else registry
    load = studies.load if load is None else load
    rows = []
    for name in sorted(registry):
        try:
            description = getattr(load(name), "DESCRIPTION", "")
        except ImportError as error:  # a broken study must not hide the others
            description = f"(cannot be imported: {error})"
        rows.append((name, description))
    return rows


def _format_table(rows: list[tuple[str, str]]) -> str:
    if not rows:
        return "no studies are registered"
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name.ljust(width)}  {description}" for name, description in rows)


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and its ``run`` sub-parser."""
    from ukjax import demo

    parser = argparse.ArgumentParser(
        prog="ukjax",
        description="Differentiable, batched simulation of constrained mechanical systems with the "
        "Udwadia-Kalaba equation.",
        epilog="Start with `ukjax demo`; `ukjax list` names the studies that reproduce the seed papers.",
    )
    parser.add_argument(
        "--float32",
        action="store_true",
        help="compute in JAX's float32 default instead of float64 (throughput runs; the error is measured, "
        "not assumed)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="do not use the persistent compilation cache (default folder: $UKJAX_CACHE_DIR, else "
        "~/.cache/ukjax/xla); with it, a second run of the same command skips most of the compile time",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "list", help="name the registered studies", description="Name the registered studies."
    )
    run = commands.add_parser(
        "run",
        help="run one study (`ukjax run NAME --help` shows its flags)",
        description="Run one study; it writes figures and metrics.json into --out (default results/NAME). "
        "`ukjax run NAME --help` shows the study's flags and their paper defaults.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="studies:\n" + _format_table(_study_table()),
    )
    run.add_argument("name", nargs="?", help="the study to run (see `ukjax list`)")
    run.add_argument("study_args", nargs=argparse.REMAINDER, help="flags of the study")
    tune_parser = commands.add_parser(
        "tune",
        help="run one tuning study (`ukjax tune NAME --help` shows its flags)",
        description="Tune gains by gradient descent through the simulation (ukjax.tune); the study writes "
        "history, figures and metrics.json into --out (default ukjax-results/tune_NAME).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="tuning studies:\n" + _format_table(_study_table(studies.TUNE_STUDIES, studies.load_tune)),
    )
    tune_parser.add_argument("name", nargs="?", help="the tuning study to run")
    tune_parser.add_argument("study_args", nargs=argparse.REMAINDER, help="flags of the tuning study")
    demo_parser = commands.add_parser("demo", help=demo.DESCRIPTION, description=demo.DESCRIPTION)
    demo.add_arguments(demo_parser)
    from ukjax.sweep import _cli as sweep_cli

    sweep_cli.add_parser(commands)
    return parser, run


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The sub-parser of command ``name``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def _tune_study(name: str | None, study_args: list[str], tune_parser: argparse.ArgumentParser) -> int:
    if name is None:
        tune_parser.print_help(sys.stderr)
        return EXIT_USAGE
    if name not in studies.TUNE_STUDIES:
        known = ", ".join(sorted(studies.TUNE_STUDIES))
        print(f"ukjax tune: unknown tuning study {name!r} (known: {known})", file=sys.stderr)
        return EXIT_USAGE
    module = studies.load_tune(name)
    description = getattr(module, "DESCRIPTION", None)
    parser = argparse.ArgumentParser(prog=f"ukjax tune {name}", description=description)
    module.add_arguments(parser)
    args = parser.parse_args(study_args)
    module.run(args)
    print(f"ukjax tune {name}: results in {args.out}")
    return 0


def _run_study(name: str | None, study_args: list[str], run_parser: argparse.ArgumentParser) -> int:
    if name is None:
        run_parser.print_help(sys.stderr)
        return EXIT_USAGE
    if name not in studies.STUDIES:
        known = ", ".join(sorted(studies.STUDIES)) or "none registered"
        print(
            f"ukjax run: unknown study {name!r} (known studies: {known}); see `ukjax list`", file=sys.stderr
        )
        return EXIT_USAGE
    module = studies.load(name)
    parser = argparse.ArgumentParser(
        prog=f"ukjax run {name}", description=getattr(module, "DESCRIPTION", None)
    )
    module.add_arguments(parser)
    if not any("--out" in action.option_strings for action in parser._actions):
        parser.add_argument("--out", default=f"results/{name}", help="output folder (default: %(default)s)")
    args = parser.parse_args(study_args)
    module.run(args)
    print(f"ukjax run {name}: results in {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ukjax`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, run_parser = _parser()
    try:
        return _dispatch(parser, run_parser, argv)
    except SystemExit as exit_:  # argparse's --help and usage errors: report the status, don't exit

        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    except ValueError as error:  # input refused before any work (ukjax._validation): the message is the help
        print(f"ukjax: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _dispatch(parser, run_parser, argv) -> int:
    args = parser.parse_args(argv)
    if args.command == "sweep":
        from ukjax.sweep import _cli as sweep_cli

        sweep_cli.initialize(args)  # joins a multi-process run before any JAX computation
    if not args.float32:
        from ukjax._config import enable_float64

        enable_float64()
    if not args.no_cache:
        from ukjax._config import enable_compilation_cache

        enable_compilation_cache()
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "list":
        print(_format_table(_study_table()))
        print("tuning studies (ukjax tune NAME):")
        print(_format_table(_study_table(studies.TUNE_STUDIES, studies.load_tune)))
        return 0
    if args.command == "tune":
        return _tune_study(args.name, args.study_args, _subparser(parser, "tune"))
    if args.command == "run":
        return _run_study(args.name, args.study_args, run_parser)
    if args.command == "sweep":
        from ukjax.sweep import _cli as sweep_cli

        return sweep_cli.main(args)
    from ukjax import demo

    demo.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
