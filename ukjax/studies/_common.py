"""What every study and benchmark records: the machine, the versions, and results as JSON."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ukjax._io import environment as environment  # noqa: F401  (re-exported for the studies)
from ukjax._io import write_json as write_json  # noqa: F401


def pyplot():
    """matplotlib.pyplot on the Agg backend: the studies write their figures to files and open no window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> str:
    """Lay out, write (PNG, 120 dpi) and close a matplotlib figure; returns the path as a string."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def first_time_below(ts, values, level) -> float:
    """The first time |values| reaches ``level``, interpolating log|values| linearly between saved times
    (exact for an exponential decay); NaN when it never does."""
    ts, mags = np.asarray(ts), np.abs(np.asarray(values))
    below = np.nonzero(mags <= level)[0]
    if below.size == 0:
        return float("nan")
    k = int(below[0])
    if k == 0:
        return float(ts[0])
    la, lb = np.log(mags[k - 1]), np.log(mags[k])
    return float(ts[k - 1] + (ts[k] - ts[k - 1]) * (la - np.log(level)) / (la - lb))


def add_integrator_arguments(parser, *, tolerance: float, num_saves: int) -> None:
    """The adaptive-integration flags every trajectory study offers: --rtol, --atol, --num-saves."""
    parser.add_argument("--rtol", type=float, default=tolerance, help="adaptive Tsit5 relative tolerance")
    parser.add_argument("--atol", type=float, default=tolerance, help="adaptive Tsit5 absolute tolerance")
    parser.add_argument("--num-saves", type=int, default=num_saves, help="number of evenly spaced save times")


def integrator_record(args) -> dict:
    """What produced a trajectory (solver, step control, tolerances, span, saves), for metrics.json."""
    return {
        "solver": "diffrax Tsit5",
        "step": "adaptive PID",
        "rtol": args.rtol,
        "atol": args.atol,
        "t1": args.t1,
        "num_saves": args.num_saves,
    }


def fixed_step_record(dt, saves, t1=None) -> dict:
    """The fixed-step Tsit5 integration of a tuning study (step, span, saves), for metrics.json."""
    record = {"solver": "diffrax Tsit5", "step": "fixed", "dt": dt}
    if t1 is not None:
        record["t1"] = t1
    return record | {"saves": saves}


# ------------------------------------------------------------------------------------------ robot files
ROBOTS_EXTRA = "pip install 'ukjax[robots]'"


def example_robot_file(relative: str) -> Path:
    """The file ``relative`` (e.g. ``ur_description/urdf/ur5_robot.urdf``) of example-robot-data's robots:
    from the folder the environment variable ``UKJAX_ROBOT_DATA`` names where it holds the file (a copy of
    the package's ``robots`` folder, for a machine without a package index), else as installed by its wheel
    under ``site-packages/cmeel.prefix/share/example-robot-data/robots``.

    Raises FileNotFoundError, naming ``pip install 'ukjax[robots]'``, where example-robot-data or mujoco
    (which reads the file, :func:`ukjax.robots.load`) is not installed, or the file is not in the package."""
    import importlib.util
    import os
    import site
    import sysconfig

    if importlib.util.find_spec("mujoco") is None:
        raise FileNotFoundError(
            f"reading {relative} needs mujoco (ukjax.robots compiles URDF with it); "
            f"install it with {ROBOTS_EXTRA}"
        )
    copy = os.environ.get("UKJAX_ROBOT_DATA")
    if copy and (Path(copy) / relative).is_file():
        return Path(copy) / relative
    folders = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    for folder in folders:
        robots_dir = Path(folder) / "cmeel.prefix" / "share" / "example-robot-data" / "robots"
        if robots_dir.is_dir():
            path = robots_dir / relative
            if not path.is_file():
                raise FileNotFoundError(f"example-robot-data has no {relative} (looked in {robots_dir})")
            return path
    raise FileNotFoundError(
        f"{relative} comes with example-robot-data, which is not installed; install it with {ROBOTS_EXTRA} "
        "(or name a copy of its robots folder in UKJAX_ROBOT_DATA)"
    )


# ------------------------------------------------------------------------------------------ joint ranges
MAX_PRINTED_VIOLATIONS = 5  # joint-range violations printed one per line; metrics.json records all


def joint_range_record(robot, solution) -> dict:
    """What a robot study records in metrics.json of the joint ranges stated in its file: the ranges
    (``stated``: joint -> [lower, upper], rad or m), that ukjax does not enforce them, and every joint the
    trajectory (``solution``: anything with ``ts`` and ``q``, single or batched) took out of its range, as
    :class:`ukjax.diagnostics.RangeViolation` fields (:meth:`ukjax.robots.Robot.joint_range_violations`)."""
    return {
        "stated": {name: [lower, upper] for _, name, lower, upper in robot.coordinate_ranges},
        "enforced": False,
        "violations": [v._asdict() for v in robot.joint_range_violations(solution)],
    }


def joint_range_lines(record: dict, label: str = "") -> list[str]:
    """The printed summary of a :func:`joint_range_record`: one line when no range is stated or every
    joint stayed in its range; otherwise a warning and the first :data:`MAX_PRINTED_VIOLATIONS` violations,
    one per line."""
    from ukjax.diagnostics import RangeViolation

    prefix = f"joint ranges{f' ({label})' if label else ''}"
    stated, violations = record["stated"], record["violations"]
    if not stated:
        return [f"  {prefix}: none stated in the file"]
    if not violations:
        return [f"  {prefix}: held at every saved time ({len(stated)} stated; not enforced)"]
    lines = [
        f"  WARNING {prefix}: {len(violations)} joint-range violation(s); ukjax does not enforce the "
        "file's joint limits, so the trajectory passed through them:"
    ]
    lines += [f"    {RangeViolation(**v).describe()}" for v in violations[:MAX_PRINTED_VIOLATIONS]]
    if len(violations) > MAX_PRINTED_VIOLATIONS:
        lines.append(f"    ... and {len(violations) - MAX_PRINTED_VIOLATIONS} more in metrics.json")
    return lines


# ------------------------------------------------------------------------------------------ output folders
RESULTS_ROOT = "ukjax-results"  # default parent of every study's output, relative to the current directory
RESULT_FILES = ("metrics.json", "history.json")  # a folder holding one of these holds results


def default_out(name: str) -> str:
    """``ukjax-results/NAME``: where a study, a tuning study or the demo writes unless ``--out`` says else."""
    return f"{RESULTS_ROOT}/{name}"


def add_output_arguments(parser, name: str) -> None:
    """``--out`` (default ``ukjax-results/NAME``) and ``--overwrite``, the output flags every study offers."""
    parser.add_argument(
        "--out",
        default=default_out(name),
        help="output folder for figures and metrics.json, relative to the current directory",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="allow writing into a folder that already holds results (a metrics.json, or files git tracks, "
        "such as the committed results/NAME)",
    )


def _git_tracked(folder: Path) -> list[str]:
    """Files under ``folder`` that git tracks (empty outside a git work tree or without git)."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "-C", str(folder), "ls-files", "--", "."], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return listed.stdout.split() if listed.returncode == 0 else []


def prepare_output(out, *, overwrite: bool = False) -> Path:
    """Create the output folder ``out`` and return it, refusing a folder that already holds results.

    A folder holds results when it has a ``metrics.json`` or ``history.json`` or any file that git tracks
    (the committed ``results/NAME``, or the repository itself). Writing there needs ``overwrite=True``
    (``--overwrite``); otherwise a ValueError names the folder and the flag, so that no run replaces earlier
    results by accident.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if out.is_dir() and not overwrite:
        found = [name for name in RESULT_FILES if (out / name).exists()]
        tracked = _git_tracked(out)
        if tracked:
            found.append(f"{len(tracked)} file(s) tracked by git, e.g. {tracked[0]}")
        if found:
            raise ValueError(
                f"--out {out} already holds results ({'; '.join(found)}); pass --overwrite to write over "
                "them, or choose another --out"
            )
    out.mkdir(parents=True, exist_ok=True)
    return out


# ------------------------------------------------------------------------------------------ printed summaries
def status_name(message: str) -> str:
    """The short name (success, constraint_violated, ...) of a status message as metrics.json stores it, for a
    one-line summary; the message itself when it is no :data:`ukjax.RESULTS` message."""
    from ukjax.simulation import RESULTS

    names = {RESULTS.message(code): code.name for code in RESULTS}
    return names.get(message, message)


def time_text(t: float, level: float) -> str:
    """'below 0.01 at 1.234 s', or 'not below 0.01 by t1' for the NaN of :func:`first_time_below`."""
    return f"below {level:g} at {t:.3f} s" if np.isfinite(t) else f"not below {level:g} by t1"


# ------------------------------------------------------------------------------------------ tuning studies
def add_batch_arguments(
    parser,
    name: str,
    *,
    train_scenarios: int,
    heldout_scenarios: int,
    t1: float,
    dt: float,
    t1_help="span (s)",
) -> None:
    """The flags a tuning study opens with: ``--out`` and ``--overwrite`` (:func:`add_output_arguments`), the
    sizes of its training and held-out batches, the span and the fixed Tsit5 step."""
    add_output_arguments(parser, name)
    parser.add_argument("--train-scenarios", type=int, default=train_scenarios, help="training batch size")
    parser.add_argument(
        "--heldout-scenarios", type=int, default=heldout_scenarios, help="held-out batch size"
    )
    parser.add_argument("--t1", type=float, default=t1, help=t1_help)
    parser.add_argument("--dt", type=float, default=dt, help="fixed Tsit5 step (s)")


def add_optimizer_arguments(
    parser, *, steps: int, learning_rate: float, steps_help="optimizer steps", seed_help="seed of the batches"
) -> None:
    """The flags of a tuning study's gradient fit (:func:`fit_from_args`): ``--steps``, ``--learning-rate``
    (Adam in log-gains), ``--seed``, ``--no-progress``."""
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--learning-rate", type=float, default=learning_rate, help="Adam step in log-gains")
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def train_and_heldout(scenarios, args):
    """(training batch, held-out batch): ``scenarios(key, count)`` with keys 1 and 2 folded into ``--seed``
    and the counts ``--train-scenarios``, ``--heldout-scenarios`` (:func:`add_batch_arguments`)."""
    import jax

    root = jax.random.PRNGKey(args.seed)
    train = scenarios(jax.random.fold_in(root, 1), args.train_scenarios)
    heldout = scenarios(jax.random.fold_in(root, 2), args.heldout_scenarios)
    return train, heldout


def scale_uniformly(params: dict, names, keys, count: int, spread: float = 0.05) -> dict:
    """``{name: params[name] (1 + spread u)}`` for each of ``names``, u uniform in [-1, 1] of shape (count,)
    drawn with one key of ``keys`` per name: the ±5 % perturbation of a tuning study's batch."""
    import jax
    import jax.numpy as jnp

    return {
        name: params[name] * (1.0 + spread * jax.random.uniform(k, (count,), jnp.float64, -1.0, 1.0))
        for k, name in zip(keys, names, strict=False)
    }


def fit_from_args(system, space, train, objective, options, args, out, *, optimizer=None):
    """:func:`ukjax.tune.fit` as the tuning studies run it, from the flags of :func:`add_optimizer_arguments`:
    ``--steps``, the default optimizer at ``--learning-rate`` unless ``optimizer`` is given (one shared by
    several fits keeps one compiled step), ``--seed``, progress bars unless ``--no-progress``; history and
    checkpoint (``out/checkpoint.npz``, every 10 steps and at the end) under ``out``: a killed study started
    again with the same flags resumes its fit where the checkpoint left it."""
    from pathlib import Path

    from ukjax import tune
    from ukjax.tune._checkpoint import FOLDER_CHECKPOINT

    if optimizer is None:
        optimizer = tune.default_optimizer(args.steps, args.learning_rate)
    return tune.fit(
        system,
        space,
        train,
        objective,
        options=options,
        steps=args.steps,
        optimizer=optimizer,
        seed=args.seed,
        checkpoint=None if out is None else Path(out) / FOLDER_CHECKPOINT,
        out=out,
        progress=not args.no_progress,
    )
