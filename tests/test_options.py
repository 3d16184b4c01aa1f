"""The options of simulate and simulate_batch have one table (ukjax.options), which their signatures, the
sweep spec's defaults and the names ukjax.simulation exports agree with. No compilation: signatures and
tables only.
"""

import dataclasses
import inspect

from ukjax import options as _options
from ukjax import simulation
from ukjax.simulation import simulate, simulate_batch
from ukjax.sweep import _spec

BATCH_ONLY = {"batch_params": False, "chunk_size": "auto", "bucket": True, "engine": "auto", "devices": "all"}


def keyword_only(function) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY]


def test_signatures_are_the_option_table():
    """Both signatures list exactly the table's options (and t1, required), with the table's defaults; the
    one argument path (_options._arguments) reads them by these names."""
    assert simulate.__kwdefaults__ == _options.OPTION_DEFAULTS
    assert simulate_batch.__kwdefaults__ == _options.OPTION_DEFAULTS | BATCH_ONLY
    assert set(keyword_only(simulate)) == set(_options._OPTIONS)
    assert set(keyword_only(simulate_batch)) == set(_options._OPTIONS) | set(BATCH_ONLY)
    assert inspect.signature(simulate).parameters["t1"].default is inspect.Parameter.empty


def test_static_options_are_the_fields_of_the_compiled_configuration():
    fields = {f.name for f in dataclasses.fields(_options._Config)}
    assert set(_options.STATIC_OPTIONS) == fields & set(_options._OPTIONS)
    static = {"solver", "max_steps", "method", "uk_solver", "adjoint", "progress", "throw"}
    assert set(_options.STATIC_OPTIONS) == static


def test_sweep_spec_takes_simulates_defaults_and_keeps_its_format():
    """The sweep's integrator table and its static/number split come from the option table; the spec format
    (keys, their order, values) is what it was when the sweep listed them itself."""
    assert list(_spec.INTEGRATOR_DEFAULTS.items()) == [
        ("t0", 0.0), ("dt", None), ("rtol", 1e-8), ("atol", 1e-8), ("max_steps", 65536), ("method", "ldl"),
        ("uk_solver", "uk"), ("pinv_rtol", None), ("consistency_rtol", 1e-6), ("constraint_rtol", 1e-6),
        ("constraint_atol", None), ("solver", "Tsit5"), ("num_saves", 101),
    ]
    assert _spec.STATIC_INTEGRATOR == ("method", "solver", "uk_solver", "max_steps")
    assert _spec.NUMBER_INTEGRATOR == (
        "t1", "dt", "rtol", "atol", "pinv_rtol", "consistency_rtol", "constraint_rtol", "constraint_atol"
    )
    shared = set(_spec.INTEGRATOR_DEFAULTS) - {"max_steps", "consistency_rtol", "constraint_rtol", "solver",
                                               "num_saves"}
    assert all(_spec.INTEGRATOR_DEFAULTS[k] == _options.OPTION_DEFAULTS[k] for k in shared)


def test_simulation_still_exports_what_it_defined_before_the_split():
    """ukjax.simulation was one module; every public name it defined, and the private ones that other code
    imports, are still importable from it (re-exported from ukjax.solution, ukjax.diagnostics and
    ukjax.options), and are the same objects."""
    public = [
        "DEFAULT_NUM_SAVES", "DEFAULT_MAX_STEPS", "DEFAULT_CONSISTENCY_RTOL", "DEFAULT_CONSTRAINT_ATOL",
        "DEFAULT_CONSTRAINT_RTOL", "COORDINATE_RESOLUTION", "DEFAULT_CPU_CHUNK", "DTMIN_FRACTION", "RESULTS",
        "COMPLETED", "as_params", "SimulationError", "Solution", "simulate", "simulate_batch",
    ]
    private = ["_prepare", "_chunk_size", "_Config", "_Numbers", "_state_derivative"]
    for name in public + private:
        assert hasattr(simulation, name), name
    from ukjax import diagnostics, solution

    assert simulation.Solution is solution.Solution and simulation.RESULTS is solution.RESULTS
    assert simulation.DEFAULT_CONSTRAINT_ATOL is diagnostics.DEFAULT_CONSTRAINT_ATOL
    assert simulation._prepare is _options._prepare
    assert solution._SAVE_FORMAT == "ukjax.Solution/1"
