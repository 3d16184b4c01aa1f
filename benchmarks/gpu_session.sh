#!/usr/bin/env bash
# One call on a lent GPU machine (one H100/H200, no package index, ~15 minutes of device time in all, starts
# included): everything the open GPU rows need, each step under its own time limit so that a slow one cannot
# take the others' time, every result written to $OUT as it is measured.
#
#   run(command="bash benchmarks/gpu_session.sh", carry=[".robots"], timeout_s=570)
#
# .robots holds example-robot-data's UR5 and Panda files (unpacked from its wheel:
# cmeel.prefix/share/example-robot-data/robots/{ur_description,panda_description}); without it the robot rows
# say the files are missing and the rest runs. Steps, in the order of what is missing most:
#   1. benchmarks/fused_reach.py: the fused one-kernel integrator against the XLA engine on the UR5, the Panda
#      and an 8-link chain at 1e6 scenarios (float64 and float32, achieved FLOP/s and the chip's fraction);
#   2. benchmarks/gpu_suite.py, environment and sweep sections: the sweep's overhead against a bare batch;
#   3. the five-bar through the fused kernel at a larger entry-operation limit (float64, 1e5 scenarios);
#   4. tests/test_fused.py on the GPU (the kernel's real lowering, not interpret mode).
set -u
OUT=${OUT:-/tmp/ukjax-gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
export UKJAX_ROBOT_DATA=$PWD/.robots/cmeel.prefix/share/example-robot-data/robots
python3 -m pip install --no-deps -q -e . >"$OUT/install.log" 2>&1 || true
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
uptime >"$OUT/uptime-before.txt"
timeout 250 python3 benchmarks/fused_reach.py --out "$OUT/reach" --models ur5,panda,chain8 --batch 1000000 \
  --max-entry-operations 20000 --budget-s 190 >"$OUT/reach.log" 2>&1
echo "fused_reach: exit $?" >>"$OUT/steps.txt"
timeout 110 python3 benchmarks/gpu_suite.py --out "$OUT/suite" --budget-s 100 --sections environment,sweep \
  --share sweep=0.9 >"$OUT/suite.log" 2>&1
echo "gpu_suite sweep: exit $?" >>"$OUT/steps.txt"
timeout 100 python3 benchmarks/fused_reach.py --out "$OUT/reach5" --models five_bar --dtypes float64 \
  --batch 100000 --max-entry-operations 60000 >"$OUT/reach5.log" 2>&1
echo "fused_reach five_bar: exit $?" >>"$OUT/steps.txt"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 80 python3 -m pytest -o addopts= -m 'not slow' -q \
  -p no:cacheprovider -n 6 tests/test_fused.py >"$OUT/test_fused.log" 2>&1
echo "test_fused: exit $?" >>"$OUT/steps.txt"
uptime >"$OUT/uptime-after.txt"
cat "$OUT/steps.txt"
