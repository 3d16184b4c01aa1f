"""ukjax: differentiable simulation of constrained mechanical systems with the Udwadia-Kalaba equation.

Public names are re-exported here explicitly; the modules they come from are the documentation of record.
Importing ukjax changes no JAX setting: call :func:`ukjax.enable_float64` for float64 (see
:mod:`ukjax._config`). It lets XLA:CPU compile small loops into one function where JAX has not started yet
(:func:`ukjax.whole_cpu_loops`).
"""

from ukjax import multibody as multibody
from ukjax import plot as plot
from ukjax import robots as robots
from ukjax import tune as tune
from ukjax._checks import InputStatus as InputStatus
from ukjax._checks import input_status as input_status
from ukjax._config import enable_compilation_cache as enable_compilation_cache
from ukjax._config import enable_float64 as enable_float64
from ukjax._config import faster_cpu_compilation as faster_cpu_compilation
from ukjax._config import float64_enabled as float64_enabled
from ukjax._config import jax_version_supported as jax_version_supported
from ukjax._config import sequential_cpu_kernels as sequential_cpu_kernels
from ukjax._config import use_cpu_cores as use_cpu_cores
from ukjax._config import whole_cpu_loops as whole_cpu_loops
from ukjax.constraints import AccelerationLevel as AccelerationLevel
from ukjax.constraints import Baumgarte as Baumgarte
from ukjax.constraints import Holonomic as Holonomic
from ukjax.constraints import Nonholonomic as Nonholonomic
from ukjax.constraints import is_holonomic_pfaffian as is_holonomic_pfaffian
from ukjax.control import ClosedLoop as ClosedLoop
from ukjax.control import closed_loop_acceleration as closed_loop_acceleration
from ukjax.control import consistent_state as consistent_state
from ukjax.control import servo_control as servo_control
from ukjax.dynamics import ConstraintForce as ConstraintForce
from ukjax.dynamics import constraint_consistency as constraint_consistency
from ukjax.dynamics import kkt_acceleration as kkt_acceleration
from ukjax.dynamics import recursive_uk_acceleration as recursive_uk_acceleration
from ukjax.dynamics import singular_mass_acceleration as singular_mass_acceleration
from ukjax.dynamics import uk_acceleration as uk_acceleration
from ukjax.dynamics import uk_acceleration_eq35 as uk_acceleration_eq35
from ukjax.dynamics import uk_constraint_force as uk_constraint_force
from ukjax.lagrangian import rigid_body_kinetic_energy as rigid_body_kinetic_energy
from ukjax.linalg import PINV_METHODS as PINV_METHODS
from ukjax.linalg import matrix_rank as matrix_rank
from ukjax.linalg import pinv as pinv
from ukjax.linalg import psd_ginv as psd_ginv
from ukjax.linalg import psd_pinv as psd_pinv
from ukjax.linearize import Linearization as Linearization
from ukjax.simulation import RESULTS as RESULTS
from ukjax.simulation import SimulationError as SimulationError
from ukjax.simulation import Solution as Solution
from ukjax.simulation import as_params as as_params
from ukjax.simulation import simulate as simulate
from ukjax.simulation import simulate_batch as simulate_batch
from ukjax.solvers import RK4 as RK4
from ukjax.stepping import State as State
from ukjax.stepping import step as step
from ukjax.system import Layout as Layout
from ukjax.system import Level as Level
from ukjax.system import System as System
from ukjax.system import compose as compose

__version__ = "0.1.0"

whole_cpu_loops()  # before JAX starts (no import above starts it): tests/test_config.py checks that
