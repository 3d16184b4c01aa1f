"""Second GPU call of 2026-11-28: fused kernel vs XLA engine vs CPU; lockstep vs vmap on the GPU."""
import json, os, sys, time
sys.path[:0] = ["benchmarks", "."]
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
import lockstep_batch, throughput, user_scara, ukjax
from ukjax.models import scara
from ukjax import simulation
OUT = os.environ["OUT"]
res = {"device": str(jax.devices()[0])}
def save():
    json.dump(res, open(f"{OUT}/check.json", "w"), indent=1, default=str)
system, p = user_scara.system(), user_scara.params(np.float64)
base = tuple(np.asarray(x) for x in scara.initial_state(scara.default_params()))
# 1. correctness: 4096 scenarios x 1000 Tsit5 steps of 1 ms, saves every 5 steps
q0, qd0 = throughput.scenarios(base, int(os.environ.get("CHECK_M", 4096)), 1, np.float64)
def sim(engine):
    return lambda a, b: ukjax.simulate_batch(system, a, b, p, t1=1.0, ts=np.linspace(0, 1.0, 201), dt=1e-3, engine=engine).q
fused_q = np.asarray(jax.jit(sim("fused"))(q0, qd0)); xla_q = np.asarray(jax.jit(sim("xla"))(q0, qd0))
cpu = jax.devices("cpu")[0]
with jax.default_device(cpu):
    cpu_q = np.asarray(jax.jit(sim("xla"))(jax.device_put(q0, cpu), jax.device_put(qd0, cpu)))
res["fused_vs_xla_gpu"] = float(np.max(np.abs(fused_q - xla_q)))
res["fused_vs_xla_cpu"] = float(np.max(np.abs(fused_q - cpu_q)))
res["xla_gpu_vs_xla_cpu"] = float(np.max(np.abs(xla_q - cpu_q)))
res["motion_max_abs_q_end_minus_q0"] = float(np.max(np.abs(cpu_q[:, -1] - cpu_q[:, 0])))
res["finite"] = bool(np.isfinite(fused_q).all())
print(res, flush=True); save()
# 2. lockstep vs vmap, XLA engine on the GPU, 1e6 x 200 Tsit5 steps
steps, dt = 200, 5e-3
args = throughput.scenarios(base, int(os.environ.get("CHECK_N", 1_000_000)), 0, np.float64)
def run(a, b):
    return ukjax.simulate_batch(system, a, b, p, t1=steps * dt, ts=[steps * dt], dt=dt, engine="xla").q[:, -1]
def timed(label):
    fresh = lambda a, b: run(a, b)  # a new function: a new trace (the swapped solve is read while tracing)
    tic = time.perf_counter(); c = jax.jit(fresh).lower(*args).compile(); comp = time.perf_counter() - tic
    best = 1e9
    for _ in range(3):
        tic = time.perf_counter(); r = jax.block_until_ready(c(*args)); best = min(best, time.perf_counter() - tic)
    res[label] = {"compile_s": comp, "run_s": best, "scenario_steps_per_s": len(args[0]) * steps / best}
    print(label, res[label], flush=True); save()
    return np.asarray(r)
orig = simulation._solve_lockstep
a = timed("xla_lockstep")
lockstep_batch._former_path(); b = timed("xla_vmap")
simulation._solve_lockstep = orig; timed("xla_lockstep_again")
res["lockstep_vs_vmap_max_abs"] = float(np.max(np.abs(a - b))); save()
