"""Monte-Carlo sweeps at scale: many scenarios of one model, over every device and many hosts, to Parquet.

A sweep is described by a spec (TOML; see :mod:`ukjax.sweep._spec` for every field): the model (a registered
name or the user's ``module:function``, protocol in :mod:`ukjax.sweep._models`), distributions over any
leaf of the parameter pytree and of the initial state (uniform, normal, log-normal, relative ±x %, choice,
Cartesian grids), the integrator, the metrics and the number of scenarios. Specs ship with ukjax, run by
name (:func:`shipped_specs`: ``scara``, ``five_bar``, ``coordinated_robots``; ``ukjax sweep --list``).

::

    import ukjax, ukjax.sweep
    ukjax.enable_float64()
    summary = ukjax.sweep.run("scara", out="ukjax-results/sweep_scara")   # a shipped spec, or a TOML path
    table = ukjax.sweep.load(summary.out)          # pyarrow.Table, one row per scenario; .to_pandas()
    ukjax.sweep.report(summary.out)                # quantiles, failures, histograms, scatter plots
    ukjax.sweep.rerun(summary.out, [17])[0].solution   # scenario 17 again, with its full trajectory

How it runs (:mod:`ukjax.sweep._run`): chunks of one compiled function, each chunk ``shard_map``-ped over the
local devices, metrics reduced on the device; several processes (``jax.distributed``) share the chunks; one
Parquet file per chunk, written atomically by a writer thread while the next chunks compute (chunk k+1 is
dispatched before chunk k is fetched), so a run resumes where it stopped and the device does not wait for
the disk. Every file proves what it
holds (:mod:`ukjax.sweep._store`: the sweep's fingerprint, the chunk's index range and a checksum of its
contents): a resume recomputes any chunk that does not prove itself and refuses a folder of another sweep,
and :func:`load` refuses a folder that does not prove itself, each naming the file. Scenario i's random draws
depend only on the seed and i (``jax.random.fold_in``), so the table does not depend on chunk size, device
count or host count (:mod:`ukjax.sweep._scenarios`).
"""

from ukjax.sweep._models import MODELS as MODELS
from ukjax.sweep._models import Model as Model
from ukjax.sweep._models import load_model as load_model
from ukjax.sweep._report import report as report
from ukjax.sweep._run import RunSummary as RunSummary
from ukjax.sweep._run import Scenario as Scenario
from ukjax.sweep._run import initialize_distributed as initialize_distributed
from ukjax.sweep._run import rerun as rerun
from ukjax.sweep._run import run as run
from ukjax.sweep._scenarios import METRIC_DESCRIPTIONS as METRIC_DESCRIPTIONS
from ukjax.sweep._spec import Spec as Spec
from ukjax.sweep._spec import load_spec as load_spec
from ukjax.sweep._spec import shipped_specs as shipped_specs
from ukjax.sweep._store import load as load
