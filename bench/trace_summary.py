"""Where a traced step's device time goes: a jax.profiler trace (`*.xplane.pb`) summed by op kind and by op.

  python bench/accelerator.py --sections train --trace /tmp/trace      # two steps per setting under the profiler
  python bench/trace_summary.py /tmp/trace/promptbert --calls 2

Reads the trace with `jax.profiler.ProfileData` (no TensorBoard or xprof needed), so a GPU's trace brought back from a
lent device reads here on the CPU. Every event that names the HLO op it ran (`hlo_op`) counts: the GPU's kernels on
its stream lines, or on a CPU the XLA thunks on the client's threads. Prints, per HLO module (a jitted program) that
took at least 1% of the device time, its op time per call (summed over ops that may overlap), how busy the device was
between its first and last event (the union of its ops' intervals over that span: a GPU waiting on the host shows
here), the time by kind (matmul, attention, reduction, data movement, other fusions) and the longest ops.
"""

import argparse
import collections
import gzip
import pathlib
import re

import jax

# Kinds by kernel or op name, first match wins: cuBLAS/CUTLASS gemm kernels and XLA's dot thunks; cuDNN's fused
# attention; reductions (LayerNorm, softmax, bias gradients); copies, transposes and (dynamic-)slice updates.
KINDS = (
  ("matmul", re.compile(r"gemm|xmma|cutlass|cublas|dot|ynn_fusion|onednn|matmul", re.I)),
  ("attention", re.compile(r"cudnn|fmha|flash|attention", re.I)),
  ("reduction", re.compile(r"reduce", re.I)),
  (
    "data movement",
    re.compile(r"copy|transpose|dynamic.update.slice|dynamic.slice|concatenate|pad|gather|scatter", re.I),
  ),
)


def kind(op: str, kernel: str) -> str:
  text = f"{op} {kernel}"
  return next((name for name, pattern in KINDS if pattern.search(text)), "other fusions")


def op_events(path: pathlib.Path):
  """(module, op, kernel, start_ns, duration_ns) of each op: on a GPU's device planes every kernel on a stream line
  (named by the HLO op its stats give, else by itself), else the host's events that name their HLO op (the CPU's
  thunks)."""
  data = path.read_bytes()
  data = gzip.decompress(data) if path.suffix == ".gz" else data  # As bench/device_session.sh brings them back.
  planes = list(jax.profiler.ProfileData.from_serialized_xspace(data).planes)
  devices = [p for p in planes if p.name.startswith("/device:")]
  for plane in devices or [p for p in planes if p.name == "/host:CPU"]:
    for line in plane.lines:
      if devices and not line.name.startswith("Stream"):
        continue
      for event in line.events:
        stats = dict(event.stats)
        if devices or "hlo_op" in stats:
          op = str(stats.get("hlo_op", event.name))
          yield str(stats.get("hlo_module", "?")), op, event.name, event.start_ns, event.duration_ns


def busy_ns(events) -> int:
  """The union of the events' [start, end) intervals: ops on parallel streams or threads count once."""
  total, reach = 0, None
  for start, duration in sorted((e[2], e[3]) for e in events):
    end = start + duration
    if reach is None or start >= reach:
      total, reach = total + duration, end
    elif end > reach:
      total, reach = total + end - reach, end
  return total


def summarize(path: pathlib.Path, calls: int, top: int) -> None:
  by_module = collections.defaultdict(list)
  for module, *rest in op_events(path):
    by_module[module].append(rest)
  if not by_module:
    print(f"{path}: no events that name an HLO op")
    return
  time = {module: sum(e[3] for e in events) for module, events in by_module.items()}
  for module in sorted((m for m in time if time[m] >= 0.01 * sum(time.values())), key=lambda m: -time[m]):
    events, total = by_module[module], time[module]
    span = max(e[2] + e[3] for e in events) - min(e[2] for e in events)
    print(
      f"\n### {module}: {total / calls / 1e6:.2f} ms of op time per call ({len(events) // calls} ops), "
      f"the device busy {busy_ns(events) / span:.0%} of its {span / calls / 1e6:.2f} ms span per call"
    )
    kinds, ops = collections.Counter(), collections.Counter()
    for op, kernel, _, duration in events:
      kinds[kind(op, kernel)] += duration
      ops[(op, kernel)] += duration
    print("\n| kind | ms per call | share |\n|---|---|---|")
    for name, duration in kinds.most_common():
      print(f"| {name} | {duration / calls / 1e6:.2f} | {duration / total:.1%} |")
    print("\n| op | kernel | ms per call | share |\n|---|---|---|---|")
    for (op, kernel), duration in ops.most_common(top):
      print(f"| {op} | {kernel[:60]} | {duration / calls / 1e6:.3f} | {duration / total:.1%} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("traces", nargs="+", type=pathlib.Path, help="xplane.pb(.gz) files, or folders holding them")
  parser.add_argument("--calls", type=int, default=2, help="calls of the step traced (bench/accelerator.py: 2)")
  parser.add_argument("--top", type=int, default=15, help="longest ops to list")
  args = parser.parse_args()
  for trace in args.traces:
    if not trace.exists():
      raise SystemExit(f"{trace}: no such file or folder")
    files = sorted(trace.rglob("*.xplane.pb*")) if trace.is_dir() else [trace]
    if not files:
      raise SystemExit(f"{trace}: no *.xplane.pb in it")
    for path in files:
      print(f"## {path}")
      summarize(path, args.calls, args.top)


if __name__ == "__main__":
  main()
