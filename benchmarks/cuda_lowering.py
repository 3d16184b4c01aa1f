"""Loops of the CUDA (and CPU) lowering of ukjax programs, on a machine without a GPU (issue 40, "Tuning").

``jax.export`` lowers a program for a platform the machine does not have (``platforms=["cuda"]`` works on a
CPU-only jaxlib): the StableHLO it gives is what XLA:GPU would compile, so its loops can be counted here.
On a GPU every trip of a ``stablehlo.while`` costs at least a kernel launch for its condition and body
and, unless XLA captures the loop in a CUDA graph, a device-to-host copy of the condition per trip; a loop
*inside* the right-hand side (nested in the solver's step loop) pays that at every evaluation.

:func:`loops` parses the module text: every ``stablehlo.while`` with its nesting depth (how many while
loops enclose it, through ``func.call`` too) and the functions it sits in; custom calls are listed by
target. Measured programs (small sizes: lowering only, nothing is compiled or run):

* ``scara_forward``: ``simulate_batch`` of the SCARA (entrywise path, 64 scenarios, fixed-step Tsit5, one
  chunk), its ``q`` at the saves;
* ``scara_forward_vmap``: the same with the entrywise path off (``entrywise_min_batch=None``): a right-hand
  side without any loop, the baseline of the outer loops;
* ``scara_forward_chunked``: the same over 128 scenarios in two chunks of 64 (``lax.map``: one more loop),
  where the right-hand side's values are assembled behind ``ukjax._entrywise._fence`` (its own one-trip
  loop on CPU);
* ``*_vmap``: each SCARA program again with the entrywise path off;
* ``scara_tuner_gradient``: the tuner's value and forward-mode gradient (``ukjax.tune.batch_value_and_grad``,
  the objective of ``benchmarks/tune_gradient.py``, diffrax ``ForwardMode``);
* ``chain8_forward``: ``simulate_batch`` of the 8-link pinned chain as a kinematic tree
  (``ukjax.models.chain.multibody_system(8)``: the recursions are ``lax.scan`` over the joints on the CPU,
  unrolled when lowered for CUDA).

    python3 benchmarks/cuda_lowering.py                       # print the counts
    python3 benchmarks/cuda_lowering.py --out benchmarks/results/cuda-lowering-loops.json --label after
    python3 benchmarks/cuda_lowering.py --former-fence --label before --out ...  # the fence on every platform
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp

import ukjax

ukjax.enable_float64()

_FUNC = re.compile(r"func\.func\s+(?:public\s+|private\s+)?@([\w.$-]+)")
_CALL = re.compile(r"(?<![\w])(?:func\.)?call\s+@([\w.$-]+)")
_TARGET = re.compile(r"custom_call\s+@([\w.$-]+)")


def export_text(fn, *args, platform: str = "cuda") -> str:
    """The StableHLO text of ``jax.jit(fn)`` lowered for ``platform`` by ``jax.export`` (not compiled)."""
    return jax.export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


def lowered_texts(fn, *args, platforms=("cuda", "cpu")) -> dict:
    """{platform: StableHLO text} of ``jax.jit(fn)``, traced once and lowered for each platform (what
    :func:`export_text` gives per platform, at the cost of one trace: ``Traced.lower(lowering_platforms=)``,
    the lowering ``jax.export`` uses; :func:`export_text` per platform where that keyword is missing)."""
    traced = jax.jit(fn).trace(*args)
    try:
        return {p: traced.lower(lowering_platforms=(p,)).as_text() for p in platforms}
    except TypeError:
        return {p: export_text(fn, *args, platform=p) for p in platforms}


def loops(text: str) -> dict:
    """The while loops of a module's text: their count, each one's nesting depth (while loops around it,
    through calls), the count per depth, and the custom-call targets.

    The text is scanned brace by brace: a ``{`` opened on a line that starts a while region (``cond {``, ``}
    do {``) belongs to that loop; a ``func.call`` inside loops carries their depth into the callee."""
    funcs: dict[str, list[tuple[int, int]]] = {}  # name -> [(local depth of each while)]
    calls: dict[str, list[tuple[str, int]]] = {}  # caller -> [(callee, local loop depth at the call)]
    current = None
    stack: list[bool] = []  # one entry per open brace: True if it opens a while region
    for line in text.splitlines():
        stripped = line.strip()
        match = _FUNC.search(line)
        if match:
            current = match.group(1)
            funcs.setdefault(current, [])
            calls.setdefault(current, [])
            stack = []
        depth = sum(stack)
        if "stablehlo.while" in line and current is not None:
            funcs[current].append(depth)
        for callee in _CALL.findall(line):
            if current is not None:
                calls[current].append((callee, depth))
        region = stripped.startswith("cond {") or stripped.startswith("} do {") or stripped == "do {"
        for ch in _code(line):
            if ch == "{":
                stack.append(region)
            elif ch == "}" and stack:
                stack.pop()
    # Depth of each function: the deepest loop nesting of any call site (the module has no recursion).
    offset: dict[str, int] = {}

    def visit(name, base):
        if offset.get(name, -1) >= base:
            return
        offset[name] = base
        for callee, d in calls.get(name, []):
            visit(callee, base + d)

    for name in funcs:
        if not any(name == callee for cs in calls.values() for callee, _ in cs):
            visit(name, 0)
    depths = [offset.get(name, 0) + d for name, ds in funcs.items() for d in ds]
    return {
        "while": len(depths),
        "while_by_depth": {str(k): v for k, v in sorted(Counter(depths).items())},
        "custom_calls": dict(sorted(Counter(_TARGET.findall(text)).items())),
    }


def _code(line: str) -> str:
    """The line without its string literals (attribute strings may hold braces)."""
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', line)


# ------------------------------------------------------------------------------------------------ programs


def scara_batch(scenarios: int = 64, steps: int = 10, dt: float = 1e-3):
    from ukjax.studies import tune_scara

    batch = tune_scara.scenarios(jax.random.PRNGKey(0), scenarios)
    return batch, dict(t1=steps * dt, dt=dt)


def scara_forward(scenarios: int = 64, steps: int = 10, entrywise: bool = True, chunk_size=None):
    """``simulate_batch`` of the SCARA (in one chunk by default), as (function, arguments)."""
    from ukjax.models import scara

    system = scara.system()
    batch, opts = scara_batch(scenarios, steps)

    def run(q0, qd0, params):
        kwargs = dict(batch_params=True, t1=opts["t1"], dt=opts["dt"], chunk_size=chunk_size,
                      ts=jnp.linspace(0.0, opts["t1"], 5))  # fmt: skip
        if entrywise:
            return ukjax.simulate_batch(system, q0, qd0, params, **kwargs).q
        return _without_entrywise(lambda: ukjax.simulate_batch(system, q0, qd0, params, **kwargs).q)

    return run, (batch.q0, batch.qd0, batch.params)


def _without_entrywise(thunk):
    """``thunk()`` traced with the entrywise path off (every config's ``entrywise_min_batch`` = None)."""
    from ukjax import simulation

    original = simulation._batched_state_derivative

    def plain(system, config, numbers):
        return original(system, dataclasses.replace(config, entrywise_min_batch=None), numbers)

    simulation._batched_state_derivative = plain
    try:
        return thunk()
    finally:
        simulation._batched_state_derivative = original


def scara_tuner_gradient(scenarios: int = 64, steps: int = 10, mode: str = "forward", entrywise: bool = True):
    """The tuner's (loss, ∂loss/∂θ) of ``benchmarks/tune_gradient.py`` at small sizes."""
    from ukjax import tune
    from ukjax.models import scara
    from ukjax.studies import tune_scara

    system = scara.system()
    batch, opts = scara_batch(scenarios, steps)
    objective = tune_scara.objective(1e-7)
    options = tune.simulation_options(t1=opts["t1"], dt=opts["dt"], num_saves=5, chunk_size=None)
    space = tune_scara.space_for(tune_scara.gain_box(opts["dt"]), 10.0, 100.0)

    def value_and_grad(theta, batch):
        def run():
            return tune.batch_value_and_grad(
                system, space, theta, batch, objective, options=options, gradient_mode=mode
            )

        loss, _, grad = run() if entrywise else _without_entrywise(run)
        return loss, grad

    return value_and_grad, (space.init(), batch)


def chain_forward(links: int = 8, scenarios: int = 64, steps: int = 10, dt: float = 1e-3):
    from ukjax.models import chain

    system = chain.multibody_system(links)
    p = chain.default_params(links)
    q0, qd0 = chain.scenarios(p, scenarios)[:2]

    def run(q0, qd0):
        return ukjax.simulate_batch(system, q0, qd0, p, t1=steps * dt, dt=dt, chunk_size=None,
                                    ts=jnp.linspace(0.0, steps * dt, 5)).q  # fmt: skip

    return run, (q0, qd0)


PROGRAMS = {
    "scara_forward": lambda: scara_forward(),
    "scara_forward_vmap": lambda: scara_forward(entrywise=False),
    "scara_forward_chunked": lambda: scara_forward(scenarios=128, chunk_size=64),
    "scara_forward_chunked_vmap": lambda: scara_forward(scenarios=128, chunk_size=64, entrywise=False),
    "scara_tuner_gradient": lambda: scara_tuner_gradient(),
    "scara_tuner_gradient_vmap": lambda: scara_tuner_gradient(entrywise=False),
    "chain8_forward": lambda: chain_forward(),
}


def measure(names=None, platforms=("cuda", "cpu"), former_fence: bool = False) -> dict:
    from ukjax import _entrywise

    original = _entrywise._fence
    if former_fence:
        _entrywise._fence = functools.partial(original, cpu_only=False)  # its loop on every platform
    try:
        out = {}
        for name in names or PROGRAMS:
            fn, args = PROGRAMS[name]()
            texts = lowered_texts(fn, *args, platforms=platforms)
            out[name] = {platform: loops(text) for platform, text in texts.items()}
        return out
    finally:
        _entrywise._fence = original


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="*", default=None, choices=list(PROGRAMS))
    parser.add_argument("--out", type=Path, default=None, help="JSON file to add the counts to")
    parser.add_argument("--label", default="current", help="key of this measurement in --out")
    parser.add_argument(
        "--former-fence",
        action="store_true",
        help="the entrywise fence as before issue 40 (a one-trip loop on every platform)",
    )
    args = parser.parse_args(argv)
    result = measure(args.programs, former_fence=args.former_fence)
    print(json.dumps(result, indent=1))
    if args.out is not None:
        data = json.loads(args.out.read_text()) if args.out.exists() else {}
        data["jax"] = jax.__version__
        data.setdefault(args.label, {}).update(result)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
