"""The ``ukjax`` command: ``ukjax list``, ``ukjax run NAME [flags]``, ``ukjax demo [flags]`` and
``ukjax sweep SPEC [flags]``."""

from __future__ import annotations

import argparse
import sys

from ukjax import studies

EXIT_USAGE = 2


def _study_table() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered study, in name order."""
    rows = []
    for name in sorted(studies.STUDIES):
        try:
            description = getattr(studies.load(name), "DESCRIPTION", "")
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
    demo_parser = commands.add_parser("demo", help=demo.DESCRIPTION, description=demo.DESCRIPTION)
    demo.add_arguments(demo_parser)
    from ukjax.sweep import _cli as sweep_cli

    sweep_cli.add_parser(commands)
    return parser, run


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
        return 0
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
