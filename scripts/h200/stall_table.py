"""Nsight Compute's source page (``ncu --import R --page source --csv --print-source sass``, as
``w12_sass_profile.sh`` writes it, plain or gzipped) summed up: warp-stall samples by reason, executed instructions by
opcode, and the most stalled instructions. Runs anywhere (no GPU):

    python scripts/h200/stall_table.py docs/results/2026-12-03-w12-sass-h200/call1.cap.source.csv.gz
"""

import argparse
import collections
import csv
import gzip
import io


def read_rows(path: str) -> tuple[list[str], list[list[str]]]:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    rows = list(csv.reader(io.StringIO(f.read())))
  header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
  return rows[header], [r for r in rows[header + 1:] if len(r) >= len(rows[header]) - 1]


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("source_csv")
  ap.add_argument("--top", type=int, default=15)
  args = ap.parse_args()
  header, rows = read_rows(args.source_csv)
  col = {name: i for i, name in enumerate(header)}
  reasons = [h for h in header if h.startswith("stall_") and "(Not" not in h]
  by_reason, by_opcode, per_instruction = collections.Counter(), collections.Counter(), []
  for r in rows:
    samples = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
    executed = int(r[col["Instructions Executed"]] or 0)
    source = r[col["Source"]].strip()
    words = source.split()
    opcode = (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0] if words else "?")
    by_opcode[opcode.split(".")[0]] += executed
    stalls = {h: int(r[col[h]] or 0) for h in reasons}
    by_reason.update(stalls)
    per_instruction.append((samples, executed, r[col["Address"]][-5:], source, stalls))
  total = sum(by_reason.values()) or 1
  print(f"warp-stall samples: {total}")
  for reason, n in by_reason.most_common(10):
    print(f"  {reason:26s} {n:7d} {100 * n / total:5.1f} %")
  executed = sum(by_opcode.values()) or 1
  print(f"executed warp instructions: {executed}")
  for opcode, n in by_opcode.most_common(16):
    print(f"  {opcode:10s} {n:10d} {100 * n / executed:5.1f} %")
  print("most stalled instructions (samples, executions, address, SASS, top reasons):")
  for samples, runs, address, source, stalls in sorted(per_instruction, reverse=True)[:args.top]:
    top = ", ".join(f"{k[6:]} {v}" for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:2] if v)
    print(f"  {samples:5d} {runs:7d} {address} {source[:56]:56s} {top}")


if __name__ == "__main__":
  main()
