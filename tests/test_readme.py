"""The README's Python example runs as printed and its numbers make sense."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no Python example"
    namespace = {"print": lambda *args, **kwargs: None}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    # the pendulum stays on its circle (Baumgarte-stabilized, adaptive Tsit5 at 1e-8): |φ| well below 1e-6
    assert float(abs(namespace["sol"].position_residual).max()) < 1e-6
    assert int(namespace["sol"].status) == 0
