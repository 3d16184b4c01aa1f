"""The SCARA sweep at 1e6 on the GPU: as shipped, then with fsync a no-op (is the disk the bound?)."""
import json, os, shutil, sys, tempfile, time
sys.path[:0] = ["."]
import jax
jax.config.update("jax_enable_x64", True)
from ukjax import sweep
N = int(os.environ.get("SWEEP_N", 1_000_000))
res = {}
def once(label):
    spec = sweep.load_spec("scara").source
    spec["scenarios"], spec["trajectories"] = N, []
    out = tempfile.mkdtemp(prefix="sw-")
    tic = time.perf_counter()
    s = sweep.run(spec, out=out, fresh=True, progress=False)
    res[label] = {"wall_s": time.perf_counter() - tic, "compile_s": s.compile_s, "run_s": s.run_s, "chunks": s.chunks_total}
    shutil.rmtree(out, ignore_errors=True)
    print(label, res[label], flush=True)
once("as_shipped")
real = os.fsync
os.fsync = lambda fd: None
once("fsync_noop")
os.fsync = real
once("as_shipped_again")
json.dump(res, open(os.environ["OUT"] + "/sweep_io.json", "w"), indent=1)
