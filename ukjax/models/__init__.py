"""The seed papers' mechanisms, one module each.

Every model module offers ``system(...) -> ukjax.System``, ``default_params() -> dict`` (the paper's
values, as float64 arrays so they are differentiable pytree leaves) and
``initial_state(params) -> (q0, qd0)``, with the paper and equation numbers in its docstring.
"""
