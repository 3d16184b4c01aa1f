"""The test suite's time per test module: wall time, JAX's compile events and the number of compiled programs.

Run the suite with the profile on, then merge the per-worker files into a table::

    UKJAX_SUITE_PROFILE=/tmp/suite-profile python3 -m pytest
    python3 benchmarks/suite_profile.py /tmp/suite-profile --out benchmarks/results/suite-profile.json

``tests/conftest.py`` writes, per test module and xdist worker, the module's wall time (from its first test's
setup to its last test's teardown; collection, where a module computes its constants at import, is not in
it), the seconds JAX spent tracing, lowering to MLIR and compiling with XLA (``jax.monitoring``'s compile
events), the number of XLA compilations, the persistent cache's hits and misses where the cache is on
(``UKJAX_SUITE_CACHE=DIR``), and the compile seconds per program name. Compile seconds are wall seconds of
the compiling thread: under load they grow with the wall time; the counts do not.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys


def read(folder: str) -> list[dict]:
    """One row per module and worker: a module whose tests pytest ran in two stretches (it reorders tests
    around a module-scoped fixture) wrote two rows, whose seconds and counts are summed here."""
    rows: dict[tuple, dict] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        worker = os.path.basename(path)[: -len(".jsonl")]
        with open(path) as f:
            for line in filter(str.strip, f):
                found = json.loads(line)
                module = found["module"]
                row = rows.setdefault((module, worker), {"module": module, "worker": worker})
                for key, value in found.items():
                    if key == "programs":
                        programs = row.setdefault("programs", {})
                        for name, (count, seconds) in value.items():
                            had = programs.get(name, [0, 0.0])
                            programs[name] = [had[0] + count, had[1] + seconds]
                    elif key == "memory_maps":
                        row[key] = max(row.get(key, 0), value)
                    elif key != "module":
                        row[key] = row.get(key, 0) + value
    return list(rows.values())


def table(rows: list[dict], top: int = 0) -> str:
    rows = sorted(rows, key=lambda r: -r["wall_s"])
    head = "| module | worker | wall s | trace s | lower s | compile s | programs | cache hits |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    total = {k: 0.0 for k in ("wall_s", "trace_s", "lower_s", "compile_s", "compile_count", "cache_hits")}
    for r in rows:
        lines.append(
            f"| {r['module']} | {r['worker']} | {r['wall_s']:.1f} | {r.get('trace_s', 0):.1f} | "
            f"{r.get('lower_s', 0):.1f} | {r.get('compile_s', 0):.1f} | {r.get('compile_count', 0)} | "
            f"{r.get('cache_hits', 0)} |"
        )
        for k in total:
            total[k] += r.get(k, 0)
    lines.append(
        f"| **all {len(rows)} modules** | | {total['wall_s']:.0f} | {total['trace_s']:.0f} | "
        f"{total['lower_s']:.0f} | {total['compile_s']:.0f} | {int(total['compile_count'])} | "
        f"{int(total['cache_hits'])} |"
    )
    if top:
        programs: dict[str, list] = {}
        for r in rows:
            for name, (count, seconds) in r.get("programs", {}).items():
                entry = programs.setdefault(name, [0, 0.0, set()])
                entry[0] += count
                entry[1] += seconds
                entry[2].add(r["module"])
        lines += ["", "| program | compilations | compile s | modules |", "|---|---|---|---|"]
        for name, (count, seconds, modules) in sorted(programs.items(), key=lambda kv: -kv[1][1])[:top]:
            lines.append(f"| {name} | {count} | {seconds:.1f} | {len(modules)} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the UKJAX_SUITE_PROFILE folder of a suite run")
    parser.add_argument("--out", help="write the rows (and the machine) as JSON here")
    parser.add_argument("--top", type=int, default=15, help="list the programs that took longest to compile")
    parser.add_argument("--note", default="", help="free text stored with the rows (load, commit)")
    parser.add_argument("--costs", help="write {module: wall seconds} here (tests/suite_costs.json orders "
                        "the suite's modules longest first)")
    args = parser.parse_args(argv)
    rows = read(args.folder)
    if not rows:
        sys.exit(f"no profile rows in {args.folder}")
    print(table(rows, args.top))
    if args.costs:
        costs: dict[str, float] = {}
        for r in sorted(rows, key=lambda r: -r["wall_s"]):  # a module may report twice (the larger counts)
            costs.setdefault(r["module"], round(r["wall_s"], 1))
        with open(args.costs, "w") as f:
            json.dump(costs, f, indent=1)
            f.write("\n")
    if args.out:
        import jax

        record = {
            "machine": {"processor": platform.processor() or platform.machine(), "cores": os.cpu_count()},
            "versions": {"python": platform.python_version(), "jax": jax.__version__},
            "note": args.note,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
