"""The tuning loop: a compiled value-and-gradient of a risk measure over a simulated batch, any optax
optimizer, divergence back-off, history, checkpoints, early stopping.

One step of :func:`fit` at unconstrained parameters θ (see :class:`~ukjax.tune.Parametrization`):

1. the scenarios: a fixed :class:`Scenarios` batch, or ``sampler(key)`` with key = fold_in(PRNGKey(seed),
   step) (a fresh Monte-Carlo batch per step that does not depend on how the run was interrupted);
2. every scenario i is simulated with its parameters p_i(θ) (:func:`ukjax.simulate_batch`, one compiled call),
   its objective value L_i and its flag ok_i (the run reached t1 with a finite state, ``Solution.completed``,
   and L_i is finite: a run whose constraints did not settle is what the objective measures, not a failure)
   are computed;
3. loss = risk(L, ok) (:class:`~ukjax.tune.Mean`, ...), and its gradient by reverse mode (``jax.vjp``) with
   respect to a per-scenario copy θ_i of θ; the gradient is Σ_{i: ok_i} ∂loss/∂θ_i. Summing only over
   successful scenarios, after the pullback, keeps a failed scenario's NaN (0 · NaN in its own backward pass)
   out of the others' gradient: failures are masked, counted, reported, and optionally penalized;
4. the optimizer's update (default Adam with a cosine-decayed step), scaled by the back-off factor, then the
   projection of bounded coordinates onto their boxes.

Divergence: a step whose loss is not finite, whose failed fraction exceeds ``max_failure_fraction``, or whose
loss exceeds ``max_increase`` times the last accepted one, is rejected: θ and the optimizer state go back to
the last accepted point and the update is retried with the step scaled by ``backoff`` (kept for the rest of
the run). Together with bounds from the integrator's stability region (:func:`baumgarte_gain_bounds`), this
keeps the tuner out of the region where a fixed-step integrator blows up.

Derivatives go through diffrax's default ``RecursiveCheckpointAdjoint`` (reverse-mode through the solver's
steps with checkpointing); pass a fixed ``dt`` with ``max_steps = ceil((t1 - t0)/dt) + 1`` (done by default)
so that the checkpoint memory is sized to the run.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from ukjax.simulation import simulate_batch
from ukjax.tune._objectives import Mean, Objective, as_objective
from ukjax.tune._parametrization import Parametrization


class Scenarios(eqx.Module):
    """A batch of B scenarios: initial states (B, n) and, optionally, per-scenario parameters (every leaf with
    the batch axis first; None: every scenario uses the Parametrization's base parameters)."""

    q0: jax.Array
    qd0: jax.Array
    params: Any = None

    @property
    def size(self) -> int:
        return int(self.q0.shape[0])


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
):
    """(loss, summary, ∂loss/∂θ) with failed scenarios masked out of the gradient (module docstring, step 3).

    The failure penalty is a constant per failed scenario: it raises the reported loss, not the gradient."""
    risk = Mean() if risk is None else risk
    objective = as_objective(objective)
    size = scenarios.q0.shape[0]
    theta_b = _broadcast(theta, size)
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
def _compiled_value_and_grad(system, space, theta, source, key, objective, risk, options, penalty):
    scenarios = source(key) if callable(source) and not isinstance(source, Scenarios) else source
    return batch_value_and_grad(
        system, space, theta, scenarios, objective, risk=risk, options=options, failure_penalty=penalty
    )


@eqx.filter_jit
def _compiled_update(optimizer, space, theta, opt_state, grad, scale):
    # optax mixes integer step counts with floats; it is not written for JAX's strict dtype promotion.
    with jax.numpy_dtype_promotion("standard"):
        updates, opt_state = optimizer.update(grad, opt_state, theta)
    updates = jax.tree_util.tree_map(lambda u: scale * u, updates)
    return space.project(optax.apply_updates(theta, updates)), opt_state


def default_optimizer(steps: int, learning_rate: float = 0.1) -> optax.GradientTransformation:
    """Adam (Kingma & Ba 2015) with a cosine-decayed step from ``learning_rate`` to a tenth of it."""
    return optax.adam(optax.cosine_decay_schedule(learning_rate, max(int(steps), 1), alpha=0.1))


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
def _save_checkpoint(path: Path, state: dict) -> None:
    """Atomic write of the loop state (arrays as .npz, the rest as JSON inside it)."""
    arrays = {}
    for group in ("theta", "opt_state", "acc_theta", "acc_opt_state", "acc_grad", "best_theta"):
        tree = state.get(group)
        if tree is None:
            continue
        for i, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
            arrays[f"{group}/{i}"] = np.asarray(leaf)
    meta = {
        k: v
        for k, v in state.items()
        if k not in {"theta", "opt_state", "acc_theta", "acc_opt_state", "acc_grad", "best_theta"}
    }
    meta["groups"] = [g for g in ("acc_theta", "best_theta") if state.get(g) is not None]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, theta_like, opt_like) -> dict:
    with np.load(path) as data:
        meta = json.loads(bytes(data["meta"]).decode())

        def restore(group, like):
            leaves, treedef = jax.tree_util.tree_flatten(like)
            if f"{group}/0" not in data and leaves:
                return None
            return jax.tree_util.tree_unflatten(
                treedef, [jnp.asarray(data[f"{group}/{i}"]) for i in range(len(leaves))]
            )

        state = dict(meta)
        state["theta"] = restore("theta", theta_like)
        state["opt_state"] = restore("opt_state", opt_like)
        if "acc_theta" in meta["groups"]:
            state["acc_theta"] = restore("acc_theta", theta_like)
            state["acc_opt_state"] = restore("acc_opt_state", opt_like)
            state["acc_grad"] = restore("acc_grad", theta_like)
        if "best_theta" in meta["groups"]:
            state["best_theta"] = restore("best_theta", theta_like)
    return state


def write_history(out, history: list, summary: dict | None = None) -> tuple[Path, Path]:
    """history.json (records plus ``summary``) and history.csv (one row per step, tuned values flattened)."""
    from ukjax._io import write_json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
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
    csv_path = out / "history.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns + extra)
        for record in history:
            flat = {}
            for name, value in record["values"].items():
                for j, v in enumerate(np.ravel(value)):
                    flat[name if np.ndim(value) == 0 else f"{name}[{j}]"] = float(v)
            for name, value in record.get("parts", {}).items():
                flat[f"part:{name}"] = value
            writer.writerow([record.get(c) for c in columns] + [flat.get(c) for c in extra])
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
    risk=None,
    seed: int = 0,
    failure_penalty: float = 0.0,
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
        optimizer: any optax transformation; default :func:`default_optimizer` (Adam, cosine schedule).
        risk: :class:`~ukjax.tune.Mean` (default), :class:`~ukjax.tune.SmoothWorst` or
            :class:`~ukjax.tune.CVaR`.
        seed: seed of the scenario sampler; the same seed gives the same numbers.
        failure_penalty: added to the reported loss per failed fraction of the batch (no gradient).
        max_failure_fraction, max_increase, backoff, max_backoffs: divergence detection and back-off (module).
        patience, min_delta: stop after ``patience`` accepted steps without lowering the best loss by more
            than ``min_delta`` (relative); gtol: stop when the gradient norm falls below it.
        checkpoint: file (.npz) holding θ, the optimizer state, the step and the history, written every
            ``checkpoint_every`` steps and at the end; if it exists, the run resumes from it and continues
            exactly as the uninterrupted run would (same numbers).
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
    optimizer = default_optimizer(steps) if optimizer is None else optimizer
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
        seed=seed,
    )
    accepted = None  # (θ, optimizer state, gradient) of the last accepted step
    ckpt = None if checkpoint is None else Path(checkpoint)
    if ckpt is not None and ckpt.exists():
        loaded = _load_checkpoint(ckpt, theta, opt_state)
        if loaded.get("seed") != seed:
            raise ValueError(f"checkpoint {ckpt} was written with seed {loaded.get('seed')}, not {seed}")
        theta, opt_state = loaded.pop("theta"), loaded.pop("opt_state")
        if loaded.get("acc_theta") is not None:
            accepted = (loaded.pop("acc_theta"), loaded.pop("acc_opt_state"), loaded.pop("acc_grad"))
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
        _save_checkpoint(ckpt, payload)

    while state["step"] < steps and state["stopped"] == "steps":
        step = state["step"]
        key = jax.random.fold_in(root, step)
        loss, info, grad = _compiled_value_and_grad(
            system, space, theta, scenarios, key, objective, risk, options, failure_penalty
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
