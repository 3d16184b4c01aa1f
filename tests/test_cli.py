"""The ``ukjax`` command: list, run (known and unknown studies), help texts and a small ``ukjax demo``."""

import json
import subprocess
import sys
import types

import numpy as np
import pytest

from ukjax import studies
from ukjax.cli import EXIT_USAGE, main


@pytest.fixture
def fake_study(monkeypatch):
    """A registered study whose run() records the arguments it got and writes metrics.json."""
    module = types.ModuleType("ukjax_test_fake_study")
    module.DESCRIPTION = "a study that only records its arguments"
    module.calls = []

    def add_arguments(parser):
        parser.add_argument("--gain", type=float, default=200.0, help="a gain")

    def run(args):
        module.calls.append(vars(args))
        return {"gain": args.gain}

    module.add_arguments, module.run = add_arguments, run
    module.PAPER_DEFAULTS = {"--gain": "Someone et al. 2020, eq. 7"}
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(studies.STUDIES, "fake", module.__name__)
    return module


def test_list_names_registered_studies_with_description(fake_study, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "fake" in out and fake_study.DESCRIPTION in out
    for name in studies.STUDIES:
        assert name in out


def test_run_passes_study_flags_with_paper_defaults(fake_study, tmp_path, monkeypatch, capsys):
    assert main(["run", "fake", "--out", str(tmp_path)]) == 0
    assert fake_study.calls[-1] == {"gain": 200.0, "out": str(tmp_path), "overwrite": False}
    monkeypatch.chdir(tmp_path)
    assert main(["run", "fake", "--gain", "3"]) == 0  # a study without --out gets ukjax-results/NAME
    assert fake_study.calls[-1] == {"gain": 3.0, "out": "ukjax-results/fake", "overwrite": False}
    assert (tmp_path / "ukjax-results" / "fake").is_dir()


def test_run_study_help_shows_its_flags(fake_study, capsys):
    assert main(["run", "fake", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--gain" in text and "(default: 200)" in text and "(default: ukjax-results/fake)" in text
    assert "defaults taken from the paper:" in text and "--gain 200  Someone et al. 2020, eq. 7" in text
    assert not fake_study.calls


def _all_help_texts():
    """(command, help text) of the top level, every sub-command, every study and tuning study, the demo."""
    from ukjax import cli, studies

    parser, _ = cli._parser()
    texts = {"ukjax": parser.format_help()}
    for name in ("list", "run", "tune", "demo", "sweep"):
        texts[f"ukjax {name}"] = cli._subparser(parser, name).format_help()
    parsers = {f"ukjax {name}": cli._subparser(parser, name) for name in ("demo", "sweep")}
    for name in studies.STUDIES:
        parsers[f"ukjax run {name}"] = cli.study_parser(f"ukjax run {name}", studies.load(name), name)
    for name in studies.TUNE_STUDIES:
        module = studies.load_tune(name)
        parsers[f"ukjax tune {name}"] = cli.study_parser(f"ukjax tune {name}", module, f"tune_{name}")
    for command, study in parsers.items():
        texts[command] = study.format_help()
    return texts, parsers


def test_every_option_shows_its_default_and_no_seed_file_names():
    """`--help` of every command shows each option's default; user-facing text cites papers by authors, not
    by the seed file names of the specification."""
    import argparse

    texts, parsers = _all_help_texts()
    for command, study in parsers.items():
        options = [a for a in study._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
        for action in options:
            assert action.help, f"{command} {action.option_strings[0]} has no help"
            if action.default is not None:  # None: the help says what happens (e.g. sweep --out)
                shown = study._get_formatter()._get_help_string(action)
                assert "(default: " in shown or "%(default)" in shown, (command, action.option_strings)
        assert texts[command].count("(default:") >= sum(a.default is not None for a in options), command
    for command, text in texts.items():
        assert "seed 0" not in text.lower() and "seed0" not in text.lower(), command


def test_study_help_states_the_paper_defaults_with_values():
    texts, _ = _all_help_texts()
    scara = texts["ukjax run scara"]
    assert "--alpha 0.5" in scara and "--beta 200" in scara and "Xu & Liu 2017, eq. 52-54" in scara
    five_bar = " ".join(texts["ukjax run five_bar"].split())
    assert "--duration 20" in five_bar and "--alpha 1000" in five_bar and "--beta 100" in five_bar
    assert "--tols 1e-06,1e-08,1e-10" in five_bar and "de Falco, Pennestrì & Vita" in five_bar
    assert "--g 9.8" in texts["ukjax run coordinated_robots"]
    assert "--mass 2" in texts["ukjax run swarm"]
    assert "the paper prints no values for these flags" in texts["ukjax run three_rrr"]
    assert "--alpha0 0.5" in texts["ukjax tune scara"] and "--beta0 200" in texts["ukjax tune scara"]
    demo = " ".join(texts["ukjax demo"].split())
    assert "Xu & Liu 2017, eq. 52-54: 0.5" in demo and "(default: 20)" in demo and "helix" in demo


def test_run_unknown_study_is_a_usage_error(capsys):
    assert main(["run", "no-such-study"]) == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert "unknown study 'no-such-study'" in err and "ukjax list" in err


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["run"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["demo", "--scenarios", "many"]) == 2


def test_console_entry_point_exit_code():
    """`python -m ukjax.cli` (what the console script runs) exits with main's status."""
    result = subprocess.run(
        [sys.executable, "-m", "ukjax.cli", "run", "no-such-study"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown study" in result.stderr


DEMO_SMALL = ["--scenarios", "8", "--duration", "0.2", "--dt", "0.01", "--saves", "11", "--solver", "bosh3"]


def test_demo_writes_metrics_and_figures(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", *DEMO_SMALL, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for phase in ("[1/3] compiling", "[2/3] integrating", "[3/3] post-processing", "scenarios/s"):
        assert phase in printed
    metrics = json.loads((out / "metrics.json").read_text())
    for figure in metrics["figures"]:
        assert (out / figure).stat().st_size > 1000
    assert len(metrics["figures"]) == 3
    # Over 0.2 s not even the default (critically damped, e^(-10 t)) gains settle the constraints to
    # constraint_rtol: every scenario runs to t1, success or constraint_violated, reported as such. The
    # paper's gains (underdamped, decay e^(-t/4)) run on the same scenarios for comparison.
    assert metrics["scenarios"] == 8 and metrics["completed"] == 8
    assert metrics["succeeded"] + metrics["failures_by_status"].get("constraint_violated", 0) == 8
    assert metrics["baumgarte"] == {"form": "linear (Xu & Liu 2017, eq. 52)", "alpha": 20.0, "beta": 100.0}
    paper = metrics["paper_gains_comparison"]
    assert paper["scenarios"] == 8 and (paper["alpha"], paper["beta"]) == (0.5, 200.0)
    assert "critically damped" in printed and "underdamped" in printed and "paper's gains" in printed
    assert metrics["steps"] == 20 and metrics["dt"] == pytest.approx(0.01)
    assert metrics["solver"] == "bosh3" and metrics["integrator"].startswith("diffrax.Bosh3")
    assert metrics["path"]["shape"].startswith("helix") and metrics["path"]["radius"] == 0.05
    assert "Bosh3 fixed step 0.01 s" in printed and "α = 20, β = 100" in printed
    assert "α = 0.5, β = 200" in printed
    assert "environment" in metrics and metrics["throughput"]["scenarios_per_s"] > 0
    for key in ("path_error_m", "phi_norm"):
        peak, tail = metrics[key]["peak"], metrics[key]["tail"]
        for stats in (peak, tail):
            assert np.isfinite([stats["max"], stats["median"], stats["p95"]]).all()
            assert 0 <= stats["median"] <= stats["p95"] <= stats["max"]
        assert tail["max"] <= peak["max"]
    # Initial joint errors of 1° (std) on arms of 0.2-0.25 m put the end effector a few mm to cm off the helix
    # at t = 0 (Xu & Liu 2017's initial state is itself 5.7 mm off); Baumgarte feedback (φ̈ + 20 φ̇ + 100 φ
    # = 0) does not let that grow: every path error stays within 10 cm, far below the 0.45 m reach (Bosh3 at
    # 10 ms: h|λ| = 0.1 for the double Baumgarte root -10, well inside its stability region).
    assert 1e-4 < metrics["path_error_m"]["peak"]["max"] < 0.1


def test_a_second_demo_reads_its_program_instead_of_tracing_it(tmp_path, capsys):
    """With a compilation cache on (the suite's), a second ``ukjax demo`` with the same options reads its
    traced chunk program from the program cache (ukjax._programs) and reports the same numbers (which
    options make another program: tests/test_programs.py)."""
    from ukjax._programs import READ, TRACED, program_folder

    runs = {}
    for name in ("first", "second"):
        args = [*DEMO_SMALL, "--paper-comparison", "0", "--out", str(tmp_path / name)]
        assert main(["demo", *args]) == 0
        runs[name] = (capsys.readouterr().out, json.loads((tmp_path / name / "metrics.json").read_text()))
    if program_folder() is None:  # UKJAX_SUITE_CACHE=off: no cache, every run traced
        assert all(f"({TRACED})" in printed for printed, _ in runs.values())
        return
    assert f"({READ})" in runs["second"][0]
    assert runs["second"][1]["path_error_m"] == runs["first"][1]["path_error_m"]
    assert runs["second"][1]["phi_norm"] == runs["first"][1]["phi_norm"]


def test_demo_in_one_program_gives_the_numbers_of_its_two(tmp_path, capsys, monkeypatch):
    """Off the CPU (a GPU) the demo compiles each chunk as one program, ``simulate_batch`` inside a ``jit``
    (whose engine="auto" takes the fused kernel there); forced here on the CPU, it reports the same statuses
    and statistics, to the last digit, as the two programs compiled side by side."""
    from ukjax import demo

    runs = {}
    for name, side_by_side in (("two", True), ("one", False)):
        monkeypatch.setattr(demo, "side_by_side", lambda value=side_by_side: value)
        args = [*DEMO_SMALL, "--paper-comparison", "0", "--out", str(tmp_path / name)]
        assert main(["demo", *args]) == 0
        runs[name] = json.loads((tmp_path / name / "metrics.json").read_text())
    capsys.readouterr()
    for key in ("succeeded", "failures_by_status", "path_error_m", "phi_norm"):
        assert runs["one"][key] == runs["two"][key], key


def test_demo_refuses_an_unknown_solver(capsys, tmp_path):
    assert main(["demo", "--solver", "rk99", "--out", str(tmp_path)]) == 2
    assert "invalid choice: 'rk99'" in capsys.readouterr().err


def test_demo_refuses_a_step_longer_than_the_span(capsys, tmp_path):
    # refused before any scenario is drawn: nothing is compiled
    assert main(["demo", "--scenarios", "2", "--duration", "1", "--dt", "10", "--out", str(tmp_path)]) == 2
    assert "--dt 10 s is not smaller than --duration 1 s" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------ files that fail
@pytest.fixture
def writing_study(monkeypatch):
    """A registered study whose run() writes metrics.json through ukjax's atomic writer."""
    from pathlib import Path

    from ukjax._io import write_json

    module = types.ModuleType("ukjax_test_writing_study")
    module.DESCRIPTION = "a study that writes metrics.json"
    module.add_arguments = lambda parser: None
    module.run = lambda args: write_json(
        Path(args.out) / "metrics.json", {"ok": True}, with_environment=False
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(studies.STUDIES, "writer", module.__name__)
    return module


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ukjax: error: "), captured.err
    assert "Traceback" not in captured.err and "results in" not in captured.out
    return lines[0]


class _FailingFile:
    """A real file opened for writing whose write() fails like a full disk."""

    def __init__(self, path, mode):
        self.handle = open(path, mode)  # noqa: SIM115 (closed by __exit__)

    def write(self, data):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def _read_only(path, mode):
    import errno

    raise OSError(errno.EROFS, "Read-only file system", str(path))


@pytest.mark.parametrize(
    "opener, reason", [(_read_only, "Read-only file system"), (_FailingFile, "No space left on device")]
)
def test_a_result_that_cannot_be_written_ends_in_one_line_naming_the_file(
    writing_study, tmp_path, monkeypatch, capsys, opener, reason
):
    # tests run as root, where a read-only folder does not stop writes: the failure is injected in the open()
    # that ukjax's atomic writer uses, as the file system would raise it
    import ukjax._io

    monkeypatch.setattr(ukjax._io, "open", opener, raising=False)
    out = tmp_path / "out"
    assert main(["run", "writer", "--out", str(out)]) == EXIT_USAGE
    line = _one_error_line(capsys)
    assert str(out / "metrics.json") in line and reason in line, line
    assert not list(out.iterdir())  # no temporary file and no partial metrics.json left behind


def test_an_output_folder_that_cannot_be_created_ends_in_one_line_naming_it(
    writing_study, tmp_path, monkeypatch, capsys
):
    import errno
    from pathlib import Path

    parent = tmp_path / "read-only"
    mkdir = Path.mkdir

    def refuse_under_parent(self, *args, **kwargs):
        if parent in self.parents or self == parent:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse_under_parent)
    out = parent / "results"
    assert main(["run", "writer", "--out", str(out)]) == EXIT_USAGE
    line = _one_error_line(capsys)
    assert line == f"ukjax: error: Permission denied: {out}"


def test_an_unreadable_sweep_spec_ends_in_one_line_naming_it(tmp_path, monkeypatch, capsys):
    import errno
    from pathlib import Path

    spec = tmp_path / "sweep_unreadable.toml"
    spec.write_text('model = "scara"\n')
    opened = Path.open

    def refuse_spec(self, *args, **kwargs):
        if self == spec:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse_spec)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--no-progress"]) == EXIT_USAGE
    assert _one_error_line(capsys) == f"ukjax: error: Permission denied: {spec}"


def test_os_error_message_names_the_paths_once():
    import errno

    from ukjax._io import ResultWriteError
    from ukjax.cli import os_error_message

    assert os_error_message(FileNotFoundError(errno.ENOENT, "No such file or directory", "/a/b")) == (
        "No such file or directory: /a/b"
    )
    assert os_error_message(OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")) == (
        "Invalid cross-device link: /a -> /b"
    )
    written = ResultWriteError(errno.ENOSPC, "cannot write /r/metrics.json: No space left on device")
    assert os_error_message(written) == "cannot write /r/metrics.json: No space left on device"
    assert os_error_message(OSError("a message\nover two lines")) == "a message over two lines"


# ------------------------------------------------------------------------------------ output folders
@pytest.mark.parametrize("kind", ["regular file", "dangling symlink", "file as parent"])
@pytest.mark.parametrize("command", ["sweep", "run"])
def test_an_out_that_is_a_file_or_a_dangling_symlink_is_named_as_such(
    writing_study, tmp_path, capsys, kind, command
):
    """It used to end in 'cannot write OUT/.ukjax-lock: File exists' (sweep) or 'File exists: OUT' (run)."""
    out = tmp_path / "out"
    if kind == "dangling symlink":
        out.symlink_to(tmp_path / "missing" / "target")
        expected = f"{out} cannot be created: it is a dangling symbolic link (to {tmp_path / 'missing'}"
    else:
        (tmp_path / "file").write_text("not a folder")
        if kind == "regular file":
            out = tmp_path / "file"
            expected = f"{out} is a regular file, not a folder"
        else:
            out = tmp_path / "file" / "out"
            expected = f"{out} cannot be created: its parent {tmp_path / 'file'} is a regular file"
    args = ["run", "writer"] if command == "run" else ["sweep", "scara", "--scenarios", "4", "--no-progress"]
    assert main([*args, "--out", str(out)]) == EXIT_USAGE
    line = _one_error_line(capsys)
    assert expected in line and "--out" in line and ".ukjax-lock" not in line, line


# ------------------------------------------------------------------------------------ ukjax tune resumes
@pytest.fixture
def tiny_tune_study(monkeypatch):
    """A registered tuning study that fits the two-mass spring's Baumgarte gains (2 scenarios, 0.1 s at
    dt = 0.01) through fit_from_args, as the shipped tuning studies do."""
    import jax.numpy as jnp

    from ukjax import tune
    from ukjax.models import two_mass_spring as tms
    from ukjax.studies._common import add_optimizer_arguments, fit_from_args

    module = types.ModuleType("ukjax_test_tiny_tune_study")
    module.DESCRIPTION = "a tiny tuning study"
    module.add_arguments = lambda parser: add_optimizer_arguments(parser, steps=12, learning_rate=0.1)

    base = tms.default_params()
    system, objective = tms.system(), tune.servo_tracking()  # built once: every run reuses one compile
    space = tune.Parametrization(base, {"alpha": tune.log(), "beta": tune.log()})
    q0 = jnp.asarray([[0.0, 2.0 * base["l"] + 0.2], [0.0, 2.0 * base["l"] - 0.1]])
    batch = tune.Scenarios(q0, jnp.zeros_like(q0).at[:, 1].set(0.3))
    options = tune.simulation_options(t1=0.1, dt=0.01, num_saves=6)

    def run(args):
        from pathlib import Path

        return fit_from_args(system, space, batch, objective, options, args, Path(args.out))

    module.run = run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(studies.TUNE_STUDIES, "tiny", module.__name__)
    return module


class _Killed(Exception):
    pass


def test_a_killed_tune_study_started_again_resumes_from_its_checkpoint(
    tiny_tune_study, tmp_path, monkeypatch, capsys
):
    """`ukjax tune` checkpoints its fit under --out (every 10 steps): killed at step 11, the same command
    starts again at step 10, not 0, and ends with the history of the uninterrupted run's first steps."""
    from ukjax import tune

    fit, evaluated = tune.fit, []

    def recording_fit(*args, kill_at=None, **kwargs):
        def callback(record):
            evaluated.append(record)
            if record["step"] == kill_at:
                raise _Killed

        return fit(*args, callback=callback, **kwargs)

    out = tmp_path / "tune"
    command = ["tune", "tiny", "--out", str(out), "--no-progress"]
    monkeypatch.setattr(tune, "fit", lambda *a, **k: recording_fit(*a, kill_at=11, **k))
    with pytest.raises(_Killed):
        main(command)
    assert (out / "checkpoint.npz").exists() and not (out / "history.json").exists()
    killed, evaluated[:] = list(evaluated), []
    monkeypatch.setattr(tune, "fit", recording_fit)
    assert main(command) == 0
    assert "resuming from the checkpoint(s)" in capsys.readouterr().out
    assert [r["step"] for r in evaluated] == [10, 11]  # resumed from the checkpoint's step
    history = json.loads((out / "history.json").read_text())["history"]
    assert [r["step"] for r in history] == list(range(12))
    assert history[:10] == json.loads(json.dumps(killed[:10]))
    assert history[10]["loss"] == killed[10]["loss"]  # the same numbers as before the kill
    # --fresh starts over (--overwrite: the folder holds results now)
    evaluated[:] = []
    assert main([*command, "--overwrite", "--fresh"]) == 0
    assert [r["step"] for r in evaluated] == list(range(12))
    # flags that change the run: refused naming the checkpoint and --fresh, nothing computed
    evaluated[:] = []
    assert main([*command, "--overwrite", "--learning-rate", "0.2"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"ukjax: error: checkpoint {out / 'checkpoint.npz'} belongs to a different"), err
    assert "--fresh discards the checkpoints" in err and "Traceback" not in err
    assert not evaluated
