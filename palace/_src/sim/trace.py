"""Timeline records and Chrome-trace / Perfetto export (L4b)."""
from __future__ import annotations

import json

UNIT_ORDER = ("scalar", "dma", "mxu", "vpu", "eup", "xlu", "vld", "vst", "ici")
_UNIT_LABEL = {"scalar": "scalar core", "dma": "DMA engines", "mxu": "MXU", "vpu": "VPU",
               "eup": "EUP", "xlu": "XLU", "vld": "vector load", "vst": "vector store", "ici": "ICI"}


class Trace:
  """Events (tid=(chip, core), unit, name, start_cycle, end_cycle, args); capped to bound memory."""
  __slots__ = ("on", "events", "cap", "dropped")

  def __init__(self, on: bool = True, cap: int = 200_000):
    self.on = on
    self.events = []
    self.cap = cap
    self.dropped = 0

  def add(self, tid, unit, name, start, end, args=None):
    if len(self.events) >= self.cap:
      self.dropped += 1
      if self.dropped == 1:
        self.events.append((tid, "scalar", "trace truncated (event cap reached)", start, start, None))
      return
    self.events.append((tid, unit, name, start, end, args))


def to_chrome_trace(events, clock_hz: float, kernel_name: str, offset_cycles: float = 0) -> dict:
  """Chrome trace JSON: one process per chip, one thread per (core, unit); times in microseconds."""
  out = []
  seen_pid, seen_tid = set(), set()
  us = 1e6 / clock_hz
  for (chip, core), unit, name, start, end, args in events:
    pid = int(chip)
    unit_idx = UNIT_ORDER.index(unit) if unit in UNIT_ORDER else len(UNIT_ORDER)
    tid = int(core) * 32 + unit_idx
    if pid not in seen_pid:
      seen_pid.add(pid)
      out.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"chip {pid}"}})
    if (pid, tid) not in seen_tid:
      seen_tid.add((pid, tid))
      out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                  "args": {"name": f"core {core} {_UNIT_LABEL.get(unit, unit)}"}})
      out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                  "args": {"sort_index": tid}})
    ev = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": unit,
          "ts": round((start + offset_cycles) * us, 4), "dur": round(max(end - start, 0) * us, 4)}
    if args:
      ev["args"] = {k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in args.items()}
    out.append(ev)
  return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": {"kernel": kernel_name}}


def write_json(obj, path) -> None:
  with open(path, "w") as f:
    json.dump(obj, f)
