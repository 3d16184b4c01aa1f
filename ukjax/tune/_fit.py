"""The tuning loop: a compiled value-and-gradient of a risk measure over a simulated batch, any optax
optimizer, divergence back-off, history, checkpoints, early stopping.

One step of :func:`fit` at unconstrained parameters θ (see :class:`~ukjax.tune.Parametrization`):

1. the scenarios: a fixed :class:`Scenarios` batch, or ``sampler(key)`` with key = fold_in(PRNGKey(seed),
   step) (a fresh Monte-Carlo batch per step that does not depend on how the run was interrupted);
2. every scenario i is simulated with its parameters p_i(θ) (:func:`ukjax.simulate_batch`, one compiled call),
   its objective value L_i and its flag ok_i (the run reached t1 with a finite state, ``Solution.completed``,
   and L_i is finite: a run whose constraints did not settle is what the objective measures, not a failure)
   are computed;
3. loss = risk(L, ok) (:class:`~ukjax.tune.Mean`, ...), and its gradient with respect to a per-scenario copy
   θ_i of θ: the gradient is Σ_{i: ok_i} (∂risk/∂L_i) ∂L_i/∂θ_i. The derivatives ∂L_i/∂θ_i come from forward
   mode (one tangent per tuned number carried through the time loop, diffrax's ``ForwardMode``; the default
   for at most ``FORWARD_MODE_MAX_PARAMETERS`` numbers) or reverse mode (``jax.vjp``). Summing only over
   successful scenarios keeps a failed scenario's NaN out of the others' gradient: failures are masked,
   counted, reported, and optionally penalized;
4. the optimizer's update (default Adam with a cosine-decayed step), scaled by the back-off factor, then the
   projection of bounded coordinates onto their boxes.

Divergence: a step whose loss is not finite, whose failed fraction exceeds ``max_failure_fraction``, or whose
loss exceeds ``max_increase`` times the last accepted one, is rejected: θ and the optimizer state go back to
the last accepted point and the update is retried with the step scaled by ``backoff`` (kept for the rest of
the run). Together with bounds from the integrator's stability region (:func:`baumgarte_gain_bounds`), this
keeps the tuner out of the region where a fixed-step integrator blows up.

Reverse mode goes through diffrax's ``RecursiveCheckpointAdjoint`` (through the solver's steps with
checkpointing); pass a fixed ``dt`` with ``max_steps = ceil((t1 - t0)/dt) + 1`` (done by default) so that the
checkpoint memory is sized to the run. Forward mode stores nothing of the trajectory.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from ukjax._io import atomic_write_text, stale_temporary, write_json
from ukjax.simulation import simulate_batch
from ukjax.tune import _checkpoint
from ukjax.tune._objectives import Mean, Objective, as_objective
from ukjax.tune._parametrization import Parametrization


class Scenarios(eqx.Module):
    """A batch of B scenarios: initial states (B, n) and, optionally, per-scenario parameters (every leaf with
    the batch axis first; None: every scenario uses the Parametrization's base parameters)."""

    q0: jax.Array
    qd0: jax.Array
    params: Any = None

    def __check_init__(self):
        shape = np.shape(self.q0)
        if len(shape) != 2 or len(np.shape(self.qd0)) != 2 or np.shape(self.qd0)[0] != shape[0]:
            raise ValueError(
                f"tune.Scenarios: q0 and qd0 must both have shape (batch, n) (q0: (batch, nq) for a system "
                f"with ball or free joints); got q0 of shape {shape} and qd0 of shape {np.shape(self.qd0)}"
            )
        for path, leaf in jax.tree_util.tree_leaves_with_path(self.params):
            leaf_shape = np.shape(leaf)
            if not leaf_shape or leaf_shape[0] != shape[0]:
                raise ValueError(
                    f"tune.Scenarios: params{jax.tree_util.keystr(path)} has shape {leaf_shape}; every "
                    f"params leaf needs the batch size {shape[0]} (of q0) as its first axis"
                )

    @property
    def size(self) -> int:
        return int(self.q0.shape[0])

    def check(self, n: int, name: str = "scenarios", nq: int | None = None) -> None:
        """Refuse (ValueError naming the field and the scenario) a batch that cannot be simulated by a system
        with n velocities and nq configuration numbers (``None``: n): not real numbers, a wrong n, no
        scenario, or a NaN or infinite entry in q0, qd0 or a floating leaf of params. Values under a jax
        transformation are not checked."""
        sizes = {"q0": n if nq is None else nq, "qd0": n}
        if self.size == 0:
            raise ValueError(f"{name} is empty: q0 has shape {np.shape(self.q0)}")
        fields = [("q0", self.q0), ("qd0", self.qd0)]
        fields += [
            (f"params{jax.tree_util.keystr(path)}", leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(self.params)
        ]
        for field, value in fields:
            if isinstance(value, jax.core.Tracer):
                continue
            values = np.asarray(value)
            if values.dtype.kind not in "biuf":
                raise ValueError(f"{name}.{field} must hold real numbers, got dtype {values.dtype}")
            if field in sizes and values.shape[1] != sizes[field]:
                raise ValueError(
                    f"{name}.{field} has {values.shape[1]} coordinates per scenario; the system has "
                    f"{sizes[field]}"
                )
            bad = ~np.isfinite(values).reshape(values.shape[0], -1).all(axis=1)
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"{name}.{field} is NaN or infinite in scenario {first} (of {self.size}; all such: "
                    f"{np.flatnonzero(bad).tolist()}): {values[first].tolist()}"
                )


def simulation_options(*, t1, dt=None, t0=0.0, ts=None, num_saves: int | None = None, **other) -> dict:
    """Keyword arguments for :func:`ukjax.simulate_batch` with the tuner's defaults: for a fixed step ``dt``,
    ``max_steps = ceil((t1 - t0)/dt) + 1`` (the exact count, so reverse mode stores no unused steps) and
    ``num_saves`` (default: one per step, at most 401) evenly spaced saves."""
    options = dict(other, t0=t0, t1=t1, dt=dt)
    if dt is not None:
        steps = int(math.ceil((t1 - t0) / dt - 1e-9))
        options.setdefault("max_steps", steps + 1)
        if ts is None:
            count = min(steps, 400) + 1 if num_saves is None else num_saves
            ts = np.linspace(t0, t1, count)
    elif ts is None and num_saves is not None:
        ts = np.linspace(t0, t1, num_saves)
    if ts is not None:
        options["ts"] = jnp.asarray(ts)
    return options


def _scenario_params(space, theta_b, scenarios):
    if scenarios.params is None:
        return jax.vmap(lambda th: space.params(th))(theta_b)
    return jax.vmap(space.params)(theta_b, scenarios.params)


def _per_scenario(system, space, theta_b, scenarios, objective, options):
    """(L_i, ok_i, parts, status) of every scenario at per-scenario parameters θ_i."""
    params_b = _scenario_params(space, theta_b, scenarios)
    sol = simulate_batch(system, scenarios.q0, scenarios.qd0, params_b, batch_params=True, **options)
    losses = jax.vmap(lambda s, p: objective(system, s, p))(sol, params_b)
    parts = jax.vmap(lambda s, p: objective.parts(system, s, p))(sol, params_b)
    ok = sol.completed & jnp.isfinite(losses)
    return losses, (ok, parts, sol.status)


def _broadcast(theta, size):
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (size, *jnp.shape(x))), theta)


def _summary(loss, losses, ok, parts, status, penalty):
    n_fail = jnp.sum(~ok)
    size = ok.shape[0]
    n_ok = jnp.maximum(jnp.sum(ok.astype(losses.dtype)), 1.0)
    mean_parts = {k: jnp.sum(jnp.where(ok, v, 0.0)) / n_ok for k, v in parts.items()}
    return dict(
        loss=loss + penalty * n_fail.astype(losses.dtype) / size,
        risk=loss,
        failures=n_fail,
        status=status,
        losses=losses,
        parts=mean_parts,
    )


def batch_loss(
    system,
    space: Parametrization,
    theta,
    scenarios: Scenarios,
    objective,
    *,
    risk=None,
    options: dict,
    failure_penalty=0.0,
):
    """loss = risk(L, ok) (+ failure_penalty · failed fraction) at θ, with a summary dict; a pure function
    (jit/vmap over θ work, e.g. a grid of θ). ``options`` are :func:`simulation_options`."""
    risk = Mean() if risk is None else risk
    objective = as_objective(objective)
    theta_b = _broadcast(theta, scenarios.q0.shape[0])
    losses, (ok, parts, status) = _per_scenario(system, space, theta_b, scenarios, objective, options)
    loss = risk(losses, ok)
    return loss, _summary(loss, losses, ok, parts, status, failure_penalty)


FORWARD_MODE_MAX_PARAMETERS = 6
"""``gradient_mode="auto"``: forward mode up to this many tuned numbers, reverse mode above (where the two
cross on the SCARA objective; :func:`resolve_gradient_mode`)."""

GRADIENT_MODES = ("auto", "forward", "reverse")


def resolve_gradient_mode(mode: str, theta) -> str:
    """The differentiation mode :func:`batch_value_and_grad` uses for θ: ``"forward"`` or ``"reverse"``.

    ``"auto"`` picks forward mode for at most :data:`FORWARD_MODE_MAX_PARAMETERS` tuned numbers. Forward mode
    carries k tangents through the same time loop as the values (diffrax's ``ForwardMode``): the cost is the
    forward pass plus about one right-hand-side JVP per tangent, and nothing of the trajectory is stored.
    Reverse mode (``RecursiveCheckpointAdjoint``) stores one state per step and recomputes each step with its
    VJP on the way back, whatever k is; it wins for many parameters. On the SCARA objective (256 scenarios ×
    1000 steps, ``benchmarks/tune_gradient.py --crossover``, 2-core Intel Xeon, forward loss 0.64-0.67 s)
    forward mode takes 1.46, 2.10, 2.51 and 4.06 s for k = 2, 4, 5 and 8, about 0.5 s more per number,
    reverse mode 3.41-3.61 s whatever k: they cross near k = 7, and up to 6 forward mode is faster and plans
    less than half the memory (before the UK solve's tangent rule materialized its solves the crossing was
    near 5, with the tangents by the ``vmap`` program between 4 and 5, and before the forward loss ran
    entry by entry near 6 to 7)."""
    if mode not in GRADIENT_MODES:
        raise ValueError(f"gradient_mode must be one of {GRADIENT_MODES}, got {mode!r}")
    if mode != "auto":
        return mode
    count = sum(int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(theta))
    return "forward" if count <= FORWARD_MODE_MAX_PARAMETERS else "reverse"


def batch_value_and_grad(
    system,
    space: Parametrization,
    theta,
    scenarios: Scenarios,
    objective,
    *,
    risk=None,
    options: dict,
    failure_penalty=0.0,
    gradient_mode: str = "auto",
):
    """(loss, summary, ∂loss/∂θ) with failed scenarios masked out of the gradient (module docstring, step 3).

    The per-scenario derivatives ∂L_i/∂θ_i come from forward mode (one tangent per tuned number) or reverse
    mode (one pullback of the weights ∂risk/∂L), as :func:`resolve_gradient_mode` decides; both give the same
    gradient to rounding. The failure penalty is a constant per failed scenario: it raises the reported loss,
    not the gradient."""
    risk = Mean() if risk is None else risk
    objective = as_objective(objective)
    size = scenarios.q0.shape[0]
    theta_b = _broadcast(theta, size)
    mode = resolve_gradient_mode(gradient_mode, theta)
    if mode == "forward":
        if options.get("adjoint") is None:
            options = dict(options, adjoint=diffrax.ForwardMode())
        flat, unravel = ravel_pytree(theta)

        def along(direction):
            return jax.jvp(
                lambda th: _per_scenario(system, space, th, scenarios, objective, options),
                (theta_b,),
                (_broadcast(unravel(direction), size),),
                has_aux=True,
            )

        basis = jnp.eye(flat.size, dtype=flat.dtype)
        losses, dlosses, (ok, parts, status) = jax.vmap(along, out_axes=(None, 0, None))(basis)
        loss, weights = jax.value_and_grad(lambda L: risk(L, ok))(losses)
        grad = unravel(jnp.sum(jnp.where(ok, weights * dlosses, 0.0), axis=1))
        return loss, _summary(loss, losses, ok, parts, status, failure_penalty), grad
    losses, pullback, (ok, parts, status) = jax.vjp(
        lambda th: _per_scenario(system, space, th, scenarios, objective, options), theta_b, has_aux=True
    )
    loss, weights = jax.value_and_grad(lambda L: risk(L, ok))(losses)
    (rows,) = pullback(jnp.where(ok, weights, 0.0))
    grad = jax.tree_util.tree_map(
        lambda g: jnp.sum(jnp.where(ok.reshape((size,) + (1,) * (g.ndim - 1)), g, 0.0), axis=0), rows
    )
    return loss, _summary(loss, losses, ok, parts, status, failure_penalty), grad


@eqx.filter_jit
def _compiled_value_and_grad(system, space, theta, source, key, objective, risk, options, penalty, mode):
    scenarios = source(key) if callable(source) and not isinstance(source, Scenarios) else source
    return batch_value_and_grad(
        system, space, theta, scenarios, objective, risk=risk, options=options, failure_penalty=penalty,
        gradient_mode=mode,
    )


@eqx.filter_jit
def _compiled_update(optimizer, space, theta, opt_state, grad, scale):
    # optax mixes integer step counts with floats; it is not written for JAX's strict dtype promotion.
    with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = optimizer.update(grad, opt_state, theta)
    updates = jax.tree_util.tree_map(lambda u: scale * u, updates)
    return space.project(optax.apply_updates(theta, updates)), opt_state


class DescribedOptimizer(optax.GradientTransformationExtraArgs):
    """An optax transformation carrying a ``description`` (str) that :func:`fit` puts in its checkpoints'
    fingerprint: what the optimizer's state cannot show (a learning rate, a schedule's length)."""


DEFAULT_OPTIMIZER = "ukjax.tune.default_optimizer("


def default_optimizer(steps: int, learning_rate: float = 0.1) -> optax.GradientTransformation:
    """Adam (Kingma & Ba 2015) with a cosine-decayed step from ``learning_rate`` to a tenth of it over
    ``steps`` steps (held at the tenth after them); its ``description`` names both numbers, so that a
    checkpoint written with it is not resumed with another schedule."""
    adam = optax.adam(optax.cosine_decay_schedule(learning_rate, max(int(steps), 1), alpha=0.1))
    described = DescribedOptimizer(adam.init, adam.update)
    described.description = f"{DEFAULT_OPTIMIZER}{int(steps)}, learning_rate={float(learning_rate)!r})"
    return described


def tree_norm(tree) -> float:
    return float(optax.tree.norm(tree))


class FitResult(eqx.Module):
    """What :func:`fit` returns.

    Attributes:
        params: full parameter pytree at the best accepted step (lowest loss).
        theta: θ at that step; values: the tuned leaves there (``{path: array}``).
        final_params, final_theta: after the last update (not evaluated).
        history: one record per evaluated step (dicts: step, loss, grad_norm, values, failures, accepted,
            scale, parts, wall_s).
        best_loss, best_step: the lowest accepted loss and its step.
        simulations: scenario-trajectories simulated (evaluated steps times batch size).
        stopped: why the loop ended ("steps", "patience", "gtol", "max_backoffs", "initial_divergence").
    """

    params: Any
    theta: dict
    values: dict
    final_params: Any
    final_theta: dict
    history: list = eqx.field(static=True)
    best_loss: float = eqx.field(static=True)
    best_step: int = eqx.field(static=True)
    simulations: int = eqx.field(static=True)
    wall_s: float = eqx.field(static=True)
    stopped: str = eqx.field(static=True)


# ------------------------------------------------------------------------------------------ checkpoints
def _fingerprint(
    system, space, scenarios, objective, risk, options, optimizer, opt_state, description, seed, loop
) -> dict:
    """What decides the numbers of a tuning run (:mod:`ukjax.tune._checkpoint`); steps are kept apart."""
    leaves = []
    theta = space.init()
    for name, spec, shape in space.specs:
        leaves.append(
            dict(
                name=name,
                transform=spec.kind,
                lower=spec.lower,
                upper=spec.upper,
                shared=spec.shared,
                leaf_shape=list(shape),
                theta_shape=list(np.shape(theta[name])),
                theta_dtype=str(jnp.result_type(theta[name])),
            )
        )
    if isinstance(scenarios, Scenarios):
        batch = _checkpoint.describe(scenarios)
    else:
        shapes = jax.eval_shape(scenarios, jax.random.PRNGKey(seed))
        shapes = jax.tree_util.tree_map(lambda s: [list(s.shape), str(s.dtype)], shapes)
        batch = {"sampler": _checkpoint.describe(scenarios), "output": _checkpoint.describe(shapes)}
    if description is None:
        description = getattr(optimizer, "description", None)
    return _checkpoint.canonical(
        dict(
            parametrization=dict(leaves=leaves, params=_checkpoint.describe(space.base)),
            optimizer=dict(
                state=_checkpoint.tree_identity(opt_state),
                description=description,
                transformation=_checkpoint.optimizer_identity(optimizer),
            ),
            options=_checkpoint.describe(options),
            objective=_checkpoint.describe(objective),
            risk=_checkpoint.describe(risk),
            scenarios=batch,
            system=_checkpoint.describe(system),
            seed=seed,
            loop=loop,
            versions=_checkpoint.versions(),
        )
    )


_STATE_KEYS = ("step", "scale", "backoffs", "history", "simulations", "stopped")


def _resume(path: Path, fingerprint: dict, steps: int, theta, opt_state, default_hint: str) -> tuple:
    """(loop state, θ, optimizer state, accepted triple or None) from the checkpoint ``path``, refused with a
    message naming the file when it belongs to another run or is damaged."""
    meta, arrays = _checkpoint.read(path)
    old = meta["fingerprint"]
    hint = ""
    old_description = (old.get("optimizer") or {}).get("description")
    if default_hint and isinstance(old_description, str) and old_description.startswith(DEFAULT_OPTIMIZER):
        hint = (
            f"the default optimizer's schedule spans the run's steps: to continue the checkpoint's run for "
            f"more steps, pass optimizer={old_description}; "
        )
    _checkpoint.check_fingerprint(path, old, fingerprint, hint)
    loaded = meta["state"]
    missing = [key for key in _STATE_KEYS if key not in loaded]
    if missing:
        raise ValueError(f"checkpoint {path}: its state lacks {missing}; {_checkpoint.AFRESH}")
    step, history = loaded["step"], loaded["history"]
    if not isinstance(step, int) or not isinstance(history, list) or len(history) != step:
        raise ValueError(
            f"checkpoint {path}: its state is inconsistent (step {step!r} with "
            f"{len(history) if isinstance(history, list) else history!r} history records); "
            f"{_checkpoint.AFRESH}"
        )
    if loaded["step"] > steps:
        raise ValueError(
            f"checkpoint {path} holds {loaded['step']} steps, more than steps={steps}: pass steps >= "
            f"{loaded['step']} to continue it; {_checkpoint.AFRESH}"
        )
    theta = _checkpoint.restore(path, arrays, "theta", theta)
    like = opt_state
    opt_state = _checkpoint.restore(path, arrays, "opt_state", like)
    accepted = None
    if "acc_theta" in meta["groups"]:
        accepted = tuple(
            _checkpoint.restore(path, arrays, group, tree)
            for group, tree in (("acc_theta", theta), ("acc_opt_state", like), ("acc_grad", theta))
        )
    if "best_theta" in meta["groups"]:
        loaded = dict(loaded, best_theta=_checkpoint.restore(path, arrays, "best_theta", theta))
    return loaded, theta, opt_state, accepted


def _save_checkpoint(path: Path, state: dict, fingerprint: dict, steps: int) -> None:
    """Atomic write of the loop state (arrays as .npz entries, the rest and the fingerprint as JSON)."""
    trees = {group: state.get(group) for group in _checkpoint.TREE_GROUPS}
    meta = dict(
        format=_checkpoint.CHECKPOINT_FORMAT,
        fingerprint=fingerprint,
        steps=steps,
        state={k: v for k, v in state.items() if k not in _checkpoint.TREE_GROUPS},
        groups=[g for g in ("acc_theta", "best_theta") if state.get(g) is not None],
    )
    _checkpoint.save(path, trees, meta)


def write_history(out, history: list, summary: dict | None = None) -> tuple[Path, Path]:
    """history.json (records plus ``summary``) and history.csv (one row per step, tuned values flattened)."""
    out = Path(out)
    json_path = write_json(
        out / "history.json", {"summary": summary or {}, "history": history}, with_environment=False
    )
    columns = ["step", "loss", "risk", "grad_norm", "failures", "accepted", "scale", "wall_s"]
    extra = []
    for record in history:
        for name, value in record["values"].items():
            for j, _ in enumerate(np.ravel(value)):
                key = name if np.ndim(value) == 0 else f"{name}[{j}]"
                if key not in extra:
                    extra.append(key)
        for name in record.get("parts", {}):
            if f"part:{name}" not in extra:
                extra.append(f"part:{name}")
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(columns + extra)
    for record in history:
        flat = {}
        for name, value in record["values"].items():
            for j, v in enumerate(np.ravel(value)):
                flat[name if np.ndim(value) == 0 else f"{name}[{j}]"] = float(v)
        for name, value in record.get("parts", {}).items():
            flat[f"part:{name}"] = value
        writer.writerow([record.get(c) for c in columns] + [flat.get(c) for c in extra])
    csv_path = atomic_write_text(out / "history.csv", text.getvalue())
    return json_path, csv_path


def _values(space, theta) -> dict:
    return {k: np.asarray(v).tolist() for k, v in space.compact_values(theta).items()}


# ------------------------------------------------------------------------------------------ the loop
def fit(
    system,
    space: Parametrization,
    scenarios: Scenarios | Callable[[jax.Array], Scenarios],
    objective: Objective,
    *,
    options: dict,
    steps: int = 100,
    optimizer: optax.GradientTransformation | None = None,
    optimizer_description: str | None = None,
    risk=None,
    seed: int = 0,
    failure_penalty: float = 0.0,
    gradient_mode: str = "auto",
    max_failure_fraction: float = 0.25,
    max_increase: float | None = 10.0,
    backoff: float = 0.5,
    max_backoffs: int = 20,
    patience: int | None = None,
    min_delta: float = 0.0,
    gtol: float | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 10,
    out: str | os.PathLike | None = None,
    progress: bool = True,
    callback: Callable[[dict], None] | None = None,
) -> FitResult:
    """Tune the leaves ``space`` names by gradient descent on risk(objective) over simulated scenarios.

    Arguments:
        system: a :class:`ukjax.System`.
        space: the :class:`~ukjax.tune.Parametrization` (tuned leaves, transforms, bounds, initial values).
        scenarios: a fixed :class:`Scenarios` batch, or ``sampler(key) -> Scenarios`` (jax-traceable; called
            inside the compiled step with key = fold_in(PRNGKey(seed), step): a fresh batch each step).
        objective: an :class:`~ukjax.tune.Objective` (or one term).
        options: simulation options, from :func:`simulation_options` (t1, dt, ts, max_steps, solver, ...).
        steps: evaluations (accepted and rejected) at most.
        optimizer: any optax transformation; default :func:`default_optimizer` (Adam, cosine schedule over
            ``steps``).
        optimizer_description: what identifies ``optimizer`` beyond what the checkpoint's fingerprint reads
            of it (e.g. ``"adam lr=0.1"``). The fingerprint holds the state's structure, shapes, dtypes and
            initial values, and the optimizer's functions with the hyperparameters their closures capture
            (:func:`ukjax.tune._checkpoint.optimizer_identity`), so ``optax.adam`` against ``optax.sgd`` or
            ``optax.nadam``, and ``optax.adam(0.1)`` against ``optax.adam(0.2)``, are caught without it;
            where a hyperparameter cannot be read (an object without attributes, nested too deep), ``fit``
            warns, naming the checkpoint, unless this is given. :func:`default_optimizer` describes itself
            (its steps and learning rate).
        risk: :class:`~ukjax.tune.Mean` (default), :class:`~ukjax.tune.SmoothWorst` or
            :class:`~ukjax.tune.CVaR`.
        seed: seed of the scenario sampler; the same seed gives the same numbers.
        failure_penalty: added to the reported loss per failed fraction of the batch (no gradient).
        gradient_mode: ``"auto"`` (forward mode for at most ``FORWARD_MODE_MAX_PARAMETERS`` tuned numbers,
            else reverse), ``"forward"`` or ``"reverse"`` (:func:`resolve_gradient_mode`); the gradients agree
            to rounding, the costs differ.
        max_failure_fraction, max_increase, backoff, max_backoffs: divergence detection and back-off (module).
        patience, min_delta: stop after ``patience`` accepted steps without lowering the best loss by more
            than ``min_delta`` (relative); gtol: stop when the gradient norm falls below it.
        checkpoint: file (.npz) holding θ, the optimizer state, the step and the history, written atomically
            every ``checkpoint_every`` steps and at the end; if it exists, the run resumes from it and
            continues exactly as the uninterrupted run would (same numbers). The file carries a fingerprint
            of the run (:mod:`ukjax.tune._checkpoint`: the parametrization, optimizer, options, objective,
            risk, scenarios, system, seed, divergence and stopping settings, library versions); a resume
            whose fingerprint differs, or a damaged file, is refused with a ValueError naming the file and
            the fields that differ (delete the file or pass another path to start afresh). ``steps`` may
            grow on resume: a finished run continues for the extra steps, exactly as a run asked for the
            larger number from the start would, when the optimizer does not depend on ``steps``. The
            default optimizer's schedule does: continue its run with
            ``optimizer=default_optimizer(<the first run's steps>)`` (the refusal says so). Fewer steps than
            the checkpoint holds are refused.
        out: folder for history.json and history.csv.
        progress: a tqdm bar with loss and gradient norm; callback: called with each step's record.
    """
    if steps < 0:
        raise ValueError(f"steps must be non-negative, got {steps}")
    if not 0 < backoff < 1:
        raise ValueError(f"backoff must lie in (0, 1), got {backoff}")
    if not callable(scenarios) and not isinstance(scenarios, Scenarios):
        raise TypeError("scenarios must be a ukjax.tune.Scenarios batch or a function key -> Scenarios")
    objective = as_objective(objective)
    risk = Mean() if risk is None else risk
    default_hint = optimizer is None
    optimizer = default_optimizer(steps) if optimizer is None else optimizer
    if isinstance(scenarios, Scenarios):
        scenarios.check(system.n, name="scenarios", nq=system.nq)
    root = jax.random.PRNGKey(seed)
    size = None

    theta = space.init()
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(theta)
    state = dict(
        step=0,
        scale=1.0,
        backoffs=0,
        history=[],
        best_loss=None,
        best_step=-1,
        best_theta=None,
        since_best=0,
        simulations=0,
        acc_loss=None,
        stopped="steps",
        wall_s=0.0,
    )
    accepted = None  # (θ, optimizer state, gradient) of the last accepted step
    ckpt = None if checkpoint is None else Path(checkpoint)
    fingerprint = None
    if ckpt is not None:
        loop = dict(
            failure_penalty=failure_penalty,
            max_failure_fraction=max_failure_fraction,
            max_increase=max_increase,
            backoff=backoff,
            max_backoffs=max_backoffs,
            patience=patience,
            min_delta=min_delta,
            gtol=gtol,
            gradient_mode=resolve_gradient_mode(gradient_mode, theta),  # the modes agree only to rounding
        )
        fingerprint = _fingerprint(
            system, space, scenarios, objective, risk, options, optimizer, opt_state,
            optimizer_description, seed, _checkpoint.describe(loop),
        )  # fmt: skip
        unseen = _checkpoint.undescribed(fingerprint["optimizer"]["transformation"])
        if unseen and fingerprint["optimizer"]["description"] is None:
            warnings.warn(
                f"checkpoint {ckpt}: the optimizer's hyperparameters cannot all be read (at "
                f"optimizer.{unseen[0]}{' and more' if len(unseen) > 1 else ''}), so a resume cannot tell "
                "this optimizer from one that differs there; pass optimizer_description to identify it",
                RuntimeWarning,
                stacklevel=2,
            )
    if ckpt is not None:
        for stale in stale_temporary(ckpt.parent, ckpt.name):  # left by a writer that was killed
            stale.unlink(missing_ok=True)
    if ckpt is not None and ckpt.exists():
        loaded, theta, opt_state, accepted = _resume(ckpt, fingerprint, steps, theta, opt_state, default_hint)
        state.update({k: v for k, v in loaded.items() if k in state})

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=state["step"], desc="ukjax tune", unit="step", dynamic_ncols=True)
    started = time.perf_counter() - state["wall_s"]

    def save():
        if ckpt is None:
            return
        payload = dict(state, theta=theta, opt_state=opt_state, wall_s=time.perf_counter() - started)
        if accepted is not None:
            payload.update(acc_theta=accepted[0], acc_opt_state=accepted[1], acc_grad=accepted[2])
        _save_checkpoint(ckpt, payload, fingerprint, steps)

    while state["step"] < steps and state["stopped"] == "steps":
        step = state["step"]
        key = jax.random.fold_in(root, step)
        loss, info, grad = _compiled_value_and_grad(
            system, space, theta, scenarios, key, objective, risk, options, failure_penalty, gradient_mode
        )
        size = int(info["losses"].shape[0])
        loss_v, risk_v = float(info["loss"]), float(info["risk"])
        failures = int(info["failures"])
        grad_norm = tree_norm(grad)
        state["simulations"] += size
        diverged = (
            not math.isfinite(risk_v)
            or not math.isfinite(grad_norm)
            or failures > max_failure_fraction * size
            or (
                max_increase is not None
                and state["acc_loss"] is not None
                and loss_v > max_increase * max(state["acc_loss"], 1e-300)
            )
        )
        record = dict(
            step=step,
            loss=loss_v,
            risk=risk_v,
            grad_norm=grad_norm,
            failures=failures,
            accepted=not diverged,
            scale=state["scale"],
            values=_values(space, theta),
            parts={k: float(v) for k, v in info["parts"].items()},
            wall_s=time.perf_counter() - started,
        )
        state["history"].append(record)
        if callback is not None:
            callback(record)
        if diverged:
            if accepted is None:
                state["stopped"] = "initial_divergence"
            elif state["backoffs"] >= max_backoffs:
                state["stopped"] = "max_backoffs"
            else:
                state["backoffs"] += 1
                state["scale"] *= backoff
                theta, opt_state = _compiled_update(optimizer, space, *accepted, jnp.asarray(state["scale"]))
        else:
            accepted = (theta, opt_state, grad)
            state["acc_loss"] = loss_v
            best = state["best_loss"]
            if best is None or loss_v < best - min_delta * abs(best):
                state["since_best"] = 0
            else:
                state["since_best"] += 1
            if best is None or loss_v < best:
                state["best_loss"], state["best_step"], state["best_theta"] = loss_v, step, theta
            if patience is not None and state["since_best"] >= patience:
                state["stopped"] = "patience"
            if gtol is not None and grad_norm < gtol:
                state["stopped"] = "gtol"
            theta, opt_state = _compiled_update(
                optimizer, space, theta, opt_state, grad, jnp.asarray(state["scale"])
            )
        state["step"] = step + 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_v:.4g}", grad=f"{grad_norm:.3g}", fail=failures, refresh=False)
        if ckpt is not None and (state["step"] % checkpoint_every == 0):
            save()
    if bar is not None:
        bar.close()
    state["wall_s"] = time.perf_counter() - started
    save()

    best_theta = state["best_theta"] if state["best_theta"] is not None else theta
    result = FitResult(
        params=space.params(best_theta),
        theta=best_theta,
        values=space.values(best_theta),
        final_params=space.params(theta),
        final_theta=theta,
        history=list(state["history"]),
        best_loss=float("nan") if state["best_loss"] is None else state["best_loss"],
        best_step=state["best_step"],
        simulations=state["simulations"],
        wall_s=state["wall_s"],
        stopped=state["stopped"],
    )
    if out is not None:
        write_history(out, result.history, summary(result, space))
    return result


def summary(result: FitResult, space: Parametrization) -> dict:
    """JSON-able summary of a fit: best loss and step, tuned values, simulations, wall time, why it ended."""
    return dict(
        best_loss=result.best_loss,
        best_step=result.best_step,
        values=_values(space, result.theta),
        evaluated_steps=len(result.history),
        rejected_steps=sum(not r["accepted"] for r in result.history),
        failures_total=sum(r["failures"] for r in result.history),
        simulations=result.simulations,
        wall_s=result.wall_s,
        stopped=result.stopped,
    )
