"""The ``ukjax`` command: ``ukjax list``, ``ukjax run NAME [flags]``, ``ukjax tune NAME [flags]``,
``ukjax sweep SPEC|NAME [flags]`` and ``ukjax demo [flags]``."""

from __future__ import annotations

import argparse
import sys

from ukjax import studies

EXIT_USAGE = 2


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default; descriptions and epilogs keep their line breaks.

    Positional arguments, options whose default is None (their help says what happens then) and helps that
    state their default already are left as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or action.default in (None, argparse.SUPPRESS) or "(default" in text:
            return action.help  # "(default" covers "%(default)s" and a help that states it in its own words
        shown = _format_default(action.default).replace("%", "%%")
        return f"{text} (default: {shown})"

    def _split_lines(self, text, width):  # as argparse's, without breaking ukjax-results/NAME at the hyphen
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _format_default(value) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_format_default(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def paper_defaults_epilog(parser: argparse.ArgumentParser, module) -> str:
    """The text under ``ukjax run NAME --help``: which defaults are the paper's, with their values and source.

    A study names them in ``PAPER_DEFAULTS`` (flag -> where the paper gives the value); every other default is
    ukjax's choice, explained in the flag's help.
    """
    sources = getattr(module, "PAPER_DEFAULTS", {})
    actions = {flag: action for action in parser._actions for flag in action.option_strings}
    unknown = sorted(set(sources) - set(actions))
    if unknown:
        raise KeyError(f"PAPER_DEFAULTS of {module.__name__} names flags the study does not have: {unknown}")
    if not sources:
        return "defaults: the paper prints no values for these flags; every default is ukjax's choice (above)"
    rows = [(f"{flag} {_format_default(actions[flag].default)}", source) for flag, source in sources.items()]
    width = max(len(value) for value, _ in rows)
    lines = ["defaults taken from the paper:"]
    lines += [f"  {value.ljust(width)}  {source}" for value, source in rows]
    lines.append("every other default is ukjax's choice (see its help); metrics.json records all values")
    return "\n".join(lines)


def study_parser(prog: str, module, name: str) -> argparse.ArgumentParser:
    """The parser of one study (or tuning study): its flags, each with its default, the paper's defaults
    below them, and the output flags ``--out`` (default ``ukjax-results/NAME``) and ``--overwrite``."""
    from ukjax.studies._common import default_out

    parser = argparse.ArgumentParser(
        prog=prog, description=getattr(module, "DESCRIPTION", None), formatter_class=HelpFormatter
    )
    module.add_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    if "--out" not in flags:
        parser.add_argument("--out", default=default_out(name), help="output folder")
    if "--overwrite" not in flags:
        parser.add_argument(
            "--overwrite", action="store_true", help="allow writing into a folder that already holds results"
        )
    parser.epilog = paper_defaults_epilog(parser, module)
    return parser


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
        epilog="Start with `ukjax demo`; `ukjax list` names the studies that reproduce the papers.\n"
        "Results go to ./ukjax-results/NAME unless --out says otherwise; a folder that already holds\n"
        "results is refused without --overwrite.",
        formatter_class=HelpFormatter,
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
        "list",
        help="name the registered studies and the shipped sweep specs",
        description="Name the registered studies, tuning studies and the shipped sweep specs.",
        formatter_class=HelpFormatter,
    )
    run = commands.add_parser(
        "run",
        help="run one study (`ukjax run NAME --help` shows its flags)",
        description="Run one study; it writes figures and metrics.json into --out (default\n"
        "./ukjax-results/NAME; a folder that already holds results needs --overwrite).\n"
        "`ukjax run NAME --help` shows the study's flags with their defaults, and which defaults\n"
        "are the paper's values.",
        formatter_class=HelpFormatter,
        epilog="studies:\n" + _format_table(_study_table()),
    )
    run.add_argument("name", nargs="?", help="the study to run (see `ukjax list`)")
    run.add_argument("study_args", nargs=argparse.REMAINDER, help="flags of the study")
    tune_parser = commands.add_parser(
        "tune",
        help="run one tuning study (`ukjax tune NAME --help` shows its flags)",
        description="Tune gains by gradient descent through the simulation (ukjax.tune); the study writes\n"
        "history, figures and metrics.json into --out (default ./ukjax-results/tune_NAME; a folder\n"
        "that already holds results needs --overwrite).",
        formatter_class=HelpFormatter,
        epilog="tuning studies:\n" + _format_table(_study_table(studies.TUNE_STUDIES, studies.load_tune)),
    )
    tune_parser.add_argument("name", nargs="?", help="the tuning study to run")
    tune_parser.add_argument("study_args", nargs=argparse.REMAINDER, help="flags of the tuning study")
    demo_parser = commands.add_parser(
        "demo", help=demo.DESCRIPTION, description=demo.DESCRIPTION, formatter_class=HelpFormatter
    )
    demo.add_arguments(demo_parser)
    demo_parser.epilog = paper_defaults_epilog(demo_parser, demo)
    from ukjax.sweep import _cli as sweep_cli

    sweep_cli.add_parser(commands)
    _subparser(parser, "sweep").formatter_class = HelpFormatter
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
    from ukjax.tune._checkpoint import FOLDER_CHECKPOINT, CheckpointMismatch

    module = studies.load_tune(name)
    parser = study_parser(f"ukjax tune {name}", module, f"tune_{name}")
    if "--fresh" not in {flag for action in parser._actions for flag in action.option_strings}:
        parser.add_argument(
            "--fresh",
            action="store_true",
            help=f"discard the fit checkpoints ({FOLDER_CHECKPOINT}) in --out and start from step 0 "
            "(default: a study started again with the same flags resumes where its checkpoints left it)",
        )
    args = parser.parse_args(study_args)
    _prepare_output(args)
    checkpoints = _tune_checkpoints(args.out)
    if args.fresh:
        for path in checkpoints:
            _remove(path)
    elif checkpoints:
        shown = ", ".join(str(p) for p in checkpoints[:3]) + (" ..." if len(checkpoints) > 3 else "")
        print(f"ukjax tune {name}: resuming from the checkpoint(s) {shown} (--fresh starts over)", flush=True)
    try:
        module.run(args)
    except CheckpointMismatch as error:
        raise ValueError(
            f"{error} (ukjax tune: --fresh discards the checkpoints in {args.out} and starts over)"
        ) from error
    print(f"ukjax tune {name}: results in {args.out}")
    return 0


def _tune_checkpoints(out) -> list:
    """The fit checkpoints a tuning study left under ``out`` (``FOLDER/checkpoint.npz``, at any depth)."""
    from pathlib import Path

    from ukjax.tune._checkpoint import FOLDER_CHECKPOINT

    folder = Path(out)
    return sorted(folder.rglob(FOLDER_CHECKPOINT)) if folder.is_dir() else []


def _remove(path) -> None:
    from ukjax._io import ResultWriteError

    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        raise ResultWriteError(error.errno, f"cannot remove {path}: {error.strerror or error}") from error


def _prepare_output(args) -> None:
    """Refuse (ValueError) an --out that already holds results unless --overwrite; create the folder."""
    from ukjax._io import not_a_folder
    from ukjax.studies._common import prepare_output

    if problem := not_a_folder(args.out, what="output folder --out"):
        raise ValueError(problem)
    prepare_output(args.out, overwrite=args.overwrite)


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
    parser = study_parser(f"ukjax run {name}", module, name)
    args = parser.parse_args(study_args)
    _prepare_output(args)
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
    except OSError as error:  # a file that cannot be read or written: one line naming it, no traceback
        print(f"ukjax: error: {os_error_message(error)}", file=sys.stderr)
        return EXIT_USAGE


def os_error_message(error: OSError) -> str:
    """One line naming the file of an ``OSError``: ``REASON: PATH`` (``REASON: PATH -> PATH2`` for a rename),
    or the message itself when it names the file already (``ukjax._io.ResultWriteError``)."""
    reason = error.strerror or str(error) or type(error).__name__
    paths = [str(p) for p in (error.filename, error.filename2) if p is not None]
    missing = [p for p in paths if p not in reason]
    if missing:
        reason = f"{reason}: {' -> '.join(missing)}"
    return " ".join(reason.split())


def _dispatch(parser, run_parser, argv) -> int:
    args = parser.parse_args(argv)
    if args.command == "sweep":
        from ukjax.sweep import _cli as sweep_cli

        sweep_cli.initialize(args)  # joins a multi-process run before any JAX computation
    if args.command == "demo":
        # The demo compiles one 256-scenario chunk and calls it once per chunk: XLA:CPU's elemental emitters
        # compile it in ~0.7x the time and run it as fast (benchmarks/demo_first_result.py). Set before any
        # JAX computation (XLA reads its flags when JAX starts its CPU backend); a user's own
        # --xla_cpu_use_fusion_emitters in XLA_FLAGS wins.
        from ukjax._config import faster_cpu_compilation

        faster_cpu_compilation()
    if not args.float32:
        from ukjax._config import enable_float64

        enable_float64()
    if not args.no_cache:
        from ukjax._config import enable_compilation_cache

        enable_compilation_cache()
    from ukjax._config import fewer_garbage_collections

    fewer_garbage_collections()
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "list":
        print(_format_table(_study_table()))
        print("tuning studies (ukjax tune NAME):")
        print(_format_table(_study_table(studies.TUNE_STUDIES, studies.load_tune)))
        from ukjax.sweep import _cli as sweep_cli

        print("sweep specs (ukjax sweep NAME):")
        print(sweep_cli.shipped_table())
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
