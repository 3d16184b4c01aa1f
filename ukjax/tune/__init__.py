"""Gradient-based tuning of parameters (Baumgarte gains, servo gains, time constants) over a simulated batch.

Three pieces, one module each:

* :mod:`ukjax.tune._objectives`: objective terms (constraint violation, servo tracking, control effort,
  peak constraint force / control, actuator limits, terminal error, user functions), weighted sums, and
  risk measures over the batch (mean, smooth worst case, CVaR) that mask failed scenarios;
* :mod:`ukjax.tune._parametrization`: which leaves of ``p`` are tuned and how (log / softplus for
  positivity, box bounds by projection or a sigmoid, one shared number for an array leaf);
* :mod:`ukjax.tune._fit`: :func:`fit`, the optax loop (one compiled value-and-gradient per step, divergence
  back-off, history as JSON/CSV, checkpoints that resume exactly and refuse to resume another run
  (:mod:`ukjax.tune._checkpoint`), early stopping), and
  :mod:`ukjax.tune._stability`: gain bounds from the integrator's stability region.

Example (the SCARA's two Baumgarte gains, one number each for all four constraint rows)::

    import ukjax
    from ukjax import tune
    from ukjax.models import scara

    ukjax.enable_float64()
    p = scara.default_params()
    q0, qd0 = scara.initial_state(p)
    space = tune.Parametrization(p, {"alpha": tune.log(shared=True), "beta": tune.log(shared=True)})
    batch = tune.Scenarios(q0[None].repeat(8, 0), qd0[None].repeat(8, 0))
    objective = tune.position_violation(rows=(0, 1, 3)) + 1e-6 * tune.peak_constraint_force()
    result = tune.fit(scara.system(), space, batch, objective, steps=30,
                      options=tune.simulation_options(t1=1.0, dt=5e-3))
    print(result.values, result.best_loss)
"""

from ukjax.tune._fit import FORWARD_MODE_MAX_PARAMETERS as FORWARD_MODE_MAX_PARAMETERS
from ukjax.tune._fit import FitResult as FitResult
from ukjax.tune._fit import Scenarios as Scenarios
from ukjax.tune._fit import batch_loss as batch_loss
from ukjax.tune._fit import batch_value_and_grad as batch_value_and_grad
from ukjax.tune._fit import default_optimizer as default_optimizer
from ukjax.tune._fit import fit as fit
from ukjax.tune._fit import resolve_gradient_mode as resolve_gradient_mode
from ukjax.tune._fit import simulation_options as simulation_options
from ukjax.tune._fit import summary as summary
from ukjax.tune._fit import write_history as write_history
from ukjax.tune._objectives import CVaR as CVaR
from ukjax.tune._objectives import Mean as Mean
from ukjax.tune._objectives import Objective as Objective
from ukjax.tune._objectives import SmoothWorst as SmoothWorst
from ukjax.tune._objectives import Term as Term
from ukjax.tune._objectives import actuator_limit as actuator_limit
from ukjax.tune._objectives import control_effort as control_effort
from ukjax.tune._objectives import custom as custom
from ukjax.tune._objectives import integrate as integrate
from ukjax.tune._objectives import peak_constraint_force as peak_constraint_force
from ukjax.tune._objectives import peak_control as peak_control
from ukjax.tune._objectives import position_violation as position_violation
from ukjax.tune._objectives import servo_tracking as servo_tracking
from ukjax.tune._objectives import smooth_max as smooth_max
from ukjax.tune._objectives import terminal_violation as terminal_violation
from ukjax.tune._objectives import velocity_violation as velocity_violation
from ukjax.tune._parametrization import Parametrization as Parametrization
from ukjax.tune._parametrization import Transform as Transform
from ukjax.tune._parametrization import box as box
from ukjax.tune._parametrization import free as free
from ukjax.tune._parametrization import log as log
from ukjax.tune._parametrization import sigmoid as sigmoid
from ukjax.tune._parametrization import softplus as softplus
from ukjax.tune._stability import baumgarte_amplification as baumgarte_amplification
from ukjax.tune._stability import baumgarte_gain_bounds as baumgarte_gain_bounds
from ukjax.tune._stability import real_stability_limit as real_stability_limit
from ukjax.tune._stability import stability_function as stability_function
