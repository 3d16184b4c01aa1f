"""What the recursive (Kalman) UK solver costs against the one-shot UK equation (Orsino 2017 eq. 4.14-4.16).

Two modular systems, both built with ``ukjax.compose`` / ``with_constraints`` so that they carry their
hierarchy of levels:

- the 3RRR mechanism of :mod:`ukjax.models.three_rrr` (n = 24, 21 rows in 3 levels: 6, 9, 6);
- a chain of 10 planar bar modules (n = 30, 20 rows): bar 1 pinned to the ground, each next bar pinned to
  the previous one, one level per joint (10 levels of 2 rows: the deepest recursion), and the same
  constraints as a single level (one Kalman update).

For each, q̈ at a batch of states (``jax.jit(jax.vmap(System.acceleration))``) by ``solver="uk"`` (Cholesky,
Moore-Penrose inverse of A M⁻¹Aᵀ: de Falco et al. eq. 35; and ``method="svd"``, M^{±1/2} and B⁺ by SVD) and
``solver="recursive"``; the calls are
interleaved round by round and the median per state is reported, with the compile time and the agreement of
the two. Also recorded: whether the covariance P after the leg levels of the 3RRR is block diagonal by leg
(the structure a block-sparse implementation could exploit, seed 003 §5).

    python3 benchmarks/recursive_solver.py            # writes benchmarks/results/recursive_solver.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_results  # noqa: E402

import ukjax  # noqa: E402
from ukjax import dynamics  # noqa: E402
from ukjax.constraints import Baumgarte, Holonomic  # noqa: E402
from ukjax.models import three_rrr  # noqa: E402
from ukjax.system import System, compose  # noqa: E402

ukjax.enable_float64()


def _bar():
    """A planar bar (x, y, θ) of its centre, length p["l"], mass p["m"], gravity along -y."""
    return System(
        mass=lambda q, t, p: jnp.diag(jnp.stack([p["m"], p["m"], p["m"] * p["l"] ** 2 / 12])),
        force=lambda q, qd, t, p: jnp.stack([jnp.zeros_like(p["m"]), -9.81 * p["m"], jnp.zeros_like(p["m"])]),
        n=3,
    )


def _end(q, l, sign):
    return q[:2] + sign * 0.5 * l * jnp.stack([jnp.cos(q[2]), jnp.sin(q[2])])


def chain(count: int, *, one_level: bool):
    """``count`` bar modules; joints as one level each, or all in one level."""
    names = [f"b{i}" for i in range(count)]
    free = compose({k: _bar() for k in names})
    layout = free.layout
    gains = Baumgarte(lambda p: (p["alpha"], p["beta"]))

    def joint(i):
        def phi(q, t, p):
            parts = layout.split(q)
            here = _end(parts[names[i]], p[names[i]]["l"], -1.0)
            there = jnp.zeros(2, q.dtype) if i == 0 else _end(parts[names[i - 1]], p[names[i - 1]]["l"], 1.0)
            return here - there

        return Holonomic(phi, baumgarte=gains, name=f"joint {i}")

    joints = [joint(i) for i in range(count)]
    if one_level:
        return free.with_constraints(*joints, level="all joints")
    system = free
    for j in joints:
        system = system.with_constraints(j)
    return system


def chain_params(count):
    p = {f"b{i}": {"m": jnp.asarray(1.0 + 0.1 * i), "l": jnp.asarray(0.5)} for i in range(count)}
    return {**p, "alpha": jnp.asarray(5.0), "beta": jnp.asarray(5.0)}


def chain_states(count, batch, rng):
    """Random joint angles mapped to bar coordinates (on the manifold), random velocities."""
    qs = []
    for _ in range(batch):
        theta = rng.uniform(-np.pi, np.pi, count)
        q, tip = [], np.zeros(2)
        for th in theta:
            e = 0.5 * np.array([np.cos(th), np.sin(th)])
            q += [*(tip + 0.5 * e), th]
            tip = tip + e
        qs.append(q)
    return jnp.asarray(qs), jnp.asarray(rng.normal(size=(batch, 3 * count)))


def rrr_states(batch, rng):
    p = three_rrr.default_params()
    qs, qds = [], []
    for t in rng.uniform(0.0, 1.0, batch):
        q, qd, _ = three_rrr.reference_state(t, p)
        qs.append(q)
        qds.append(qd + rng.normal(size=q.shape))
    return jnp.stack(qs), jnp.stack(qds)


def _timed(fn, *args, repeats):
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append(time.perf_counter() - start)
    return out


def measure(label, system, params, qs, qds, rounds, repeats):
    variants = {"uk": ("uk", "cholesky"), "uk_svd": ("uk", "svd"), "recursive": ("recursive", "cholesky")}
    fns = {
        k: jax.jit(
            jax.vmap(lambda q, qd, s=s, m=m: system.acceleration(q, qd, 0.0, params, solver=s, method=m))
        )
        for k, (s, m) in variants.items()
    }
    compile_s, results = {}, {}
    for s, fn in fns.items():
        start = time.perf_counter()
        results[s] = np.asarray(jax.block_until_ready(fn(qs, qds)))
        compile_s[s] = time.perf_counter() - start
    times = {s: [] for s in fns}
    for _ in range(rounds):  # interleaved
        for s, fn in fns.items():
            times[s] += _timed(fn, qs, qds, repeats=repeats)
    batch = qs.shape[0]
    per_state = {s: float(np.median(t)) / batch for s, t in times.items()}
    scale = float(np.max(np.abs(results["uk"])))
    return {
        "system": label,
        "n": system.n,
        "levels": [
            {
                "name": level.name,
                "rows": int(sum(c.value(qs[0], 0.0, params).shape[0] for c in level.members)),
            }
            for level in system.hierarchy
        ],
        "batch": batch,
        "first_call_seconds_incl_compile": compile_s,
        "median_seconds_per_state": per_state,
        "recursive_over_one_shot": per_state["recursive"] / per_state["uk"],
        "recursive_over_one_shot_svd": per_state["recursive"] / per_state["uk_svd"],
        "max_rel_difference_recursive_vs_one_shot": float(
            np.max(np.abs(results["recursive"] - results["uk"]))
        )
        / scale,
    }


def rrr_block_structure():
    """P after the pivot and leg levels of the 3RRR: block diagonal by leg (max |off-leg entries|)."""
    system = three_rrr.system()
    p = three_rrr.default_params()
    q, qd, _ = three_rrr.reference_state(0.3, p)
    M = system.mass_matrix(q, 0.3, p)
    blocks, _ = system.level_blocks(system.constraint_blocks(q, qd, 0.3, p), p, q.dtype)
    _, P = dynamics.recursive_uk_acceleration(
        M, system.given_force(q, qd, 0.3, p), blocks[:2], return_covariance=True
    )
    P = np.asarray(P)
    owner = np.empty(24, dtype=object)
    for name, sl in three_rrr.LAYOUT.slices.items():
        owner[sl] = name
    off = np.array([[owner[i] != owner[j] for j in range(24)] for i in range(24)])
    return {
        "max_abs_off_leg_entry_after_level_2": float(np.max(np.abs(P[off]))),
        "max_abs_entry": float(np.max(np.abs(P))),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent / "results" / "recursive_solver.json")
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    rows = [
        measure(
            "3RRR (3 levels)",
            three_rrr.system(),
            three_rrr.default_params(),
            *rrr_states(args.batch, rng),
            args.rounds,
            args.repeats,
        )
    ]
    qs, qds = chain_states(10, args.batch, rng)
    for one_level in (False, True):
        label = "chain of 10 bar modules, " + ("1 level" if one_level else "10 levels")
        rows.append(
            measure(
                label, chain(10, one_level=one_level), chain_params(10), qs, qds, args.rounds, args.repeats
            )
        )
    for row in rows:
        print(
            f"{row['system']}: one-shot {row['median_seconds_per_state']['uk'] * 1e6:.2f} us/state, "
            f"one-shot svd {row['median_seconds_per_state']['uk_svd'] * 1e6:.2f} us/state, "
            f"recursive {row['median_seconds_per_state']['recursive'] * 1e6:.2f} us/state "
            f"(x{row['recursive_over_one_shot']:.2f}); "
            f"rel. diff {row['max_rel_difference_recursive_vs_one_shot']:.1e}"
        )
    payload = {
        "what": "q̈ per state, jax.jit(jax.vmap(System.acceleration)), solver 'uk' vs 'recursive', "
        "interleaved rounds, median",
        "load_average_before_after": [load_before, os.getloadavg()],
        "rows": rows,
        "three_rrr_block_structure": rrr_block_structure(),
    }
    write_results(args.out, payload)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
