"""ukjax: differentiable simulation of constrained mechanical systems with the Udwadia-Kalaba equation.

Public names are re-exported here explicitly; the modules they come from are the documentation of record.
Importing ukjax turns on float64 (see :mod:`ukjax._config`).
"""

from ukjax._config import enable_float64_unless_opted_out as _enable_float64

_enable_float64()

from ukjax._checks import InputStatus as InputStatus  # noqa: E402
from ukjax._checks import input_status as input_status  # noqa: E402
from ukjax.constraints import AccelerationLevel as AccelerationLevel  # noqa: E402
from ukjax.constraints import Baumgarte as Baumgarte  # noqa: E402
from ukjax.constraints import Holonomic as Holonomic  # noqa: E402
from ukjax.constraints import Nonholonomic as Nonholonomic  # noqa: E402
from ukjax.constraints import is_holonomic_pfaffian as is_holonomic_pfaffian  # noqa: E402
from ukjax.control import ClosedLoop as ClosedLoop  # noqa: E402
from ukjax.control import closed_loop_acceleration as closed_loop_acceleration  # noqa: E402
from ukjax.control import consistent_state as consistent_state  # noqa: E402
from ukjax.control import servo_control as servo_control  # noqa: E402
from ukjax.dynamics import ConstraintForce as ConstraintForce  # noqa: E402
from ukjax.dynamics import constraint_consistency as constraint_consistency  # noqa: E402
from ukjax.dynamics import kkt_acceleration as kkt_acceleration  # noqa: E402
from ukjax.dynamics import recursive_uk_acceleration as recursive_uk_acceleration  # noqa: E402
from ukjax.dynamics import singular_mass_acceleration as singular_mass_acceleration  # noqa: E402
from ukjax.dynamics import uk_acceleration as uk_acceleration  # noqa: E402
from ukjax.dynamics import uk_acceleration_eq35 as uk_acceleration_eq35  # noqa: E402
from ukjax.dynamics import uk_constraint_force as uk_constraint_force  # noqa: E402
from ukjax.linalg import PINV_METHODS as PINV_METHODS  # noqa: E402
from ukjax.linalg import matrix_rank as matrix_rank  # noqa: E402
from ukjax.linalg import pinv as pinv  # noqa: E402
from ukjax.linalg import psd_pinv as psd_pinv  # noqa: E402
from ukjax.simulation import RESULTS as RESULTS  # noqa: E402
from ukjax.simulation import Solution as Solution  # noqa: E402
from ukjax.simulation import simulate as simulate  # noqa: E402
from ukjax.simulation import simulate_batch as simulate_batch  # noqa: E402
from ukjax.system import Layout as Layout  # noqa: E402
from ukjax.system import System as System  # noqa: E402
from ukjax.system import compose as compose  # noqa: E402

__version__ = "0.1.0"
