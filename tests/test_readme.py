"""The README's Python runs as printed and its numbers make sense.

The README holds one example (a pendulum and a gradient through its simulation); every ```python block of it
runs here, in order, in one namespace. The examples it points to (tuning a gain with optax, a kinematic tree)
live on the docs pages, whose own fast checks are in tests/test_docs.py."""

import math
import re
from pathlib import Path

import jax.numpy as jnp

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no Python example"
    printed = []
    namespace = {"print": lambda *args, **kwargs: printed.append(args)}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)
    # the pendulum stays on its circle (Baumgarte-stabilized, adaptive Tsit5 at 1e-8): |φ| well below 1e-6
    assert float(abs(namespace["sol"].position_residual).max()) < 1e-6
    assert int(namespace["sol"].status) == 0
    # the last line prints the gradient of the final height through the whole simulation: finite, one entry
    # per parameter
    grad = printed[1][0]
    assert set(grad) == {"mass", "length", "alpha", "beta"}
    assert all(math.isfinite(float(g)) for g in grad.values())
    # the two-link arm loaded from MJCF text: it swings under gravity from 1 rad, the hand stays on the
    # reachable annulus (0.1 m to 0.9 m from the shoulder) and the height's gradient has one entry per body
    names, hand = printed[2]
    assert names == ("shoulder", "elbow") and 0.1 <= float(jnp.linalg.norm(hand)) <= 0.9
    assert int(namespace["arm_sol"].status) == 0
    mass_gradient = printed[3][0]
    assert mass_gradient.shape == (2,) and bool(jnp.all(jnp.isfinite(mass_gradient)))
