"""Timeline records and Chrome-trace / Perfetto export (L4b)."""
from __future__ import annotations

import collections
import json
import operator

UNIT_ORDER = ("scalar", "dma", "mxu", "vpu", "eup", "xlu", "vld", "vst", "ici")
_UNIT_LABEL = {"scalar": "scalar core", "dma": "DMA engines", "mxu": "MXU", "vpu": "VPU",
               "eup": "EUP", "xlu": "XLU", "vld": "vector load", "vst": "vector store", "ici": "ICI"}


_ARGS = operator.itemgetter(5)   # an event's args (None or a dict)


class EventLog(list):
  """The event list of one launch, plus counters that are kept even when tracing is off:
  `stats["dma_bytes"]` and `stats["dma_count"]` map a direction ('hbm->vmem', ...) to totals."""
  __slots__ = ("stats", "dropped", "unnamed")

  def __init__(self):
    super().__init__()
    self.stats = {"dma_bytes": {}, "dma_count": {}}
    self.dropped = None   # (events, budget) once Report.drop_trace freed them
    self.unnamed = None   # args dicts whose "copy" is still a CopyLabel (Report.events names them)

  def name_copies(self) -> None:
    """Turn every DMA event's copy label into its text (once, when a report's events are read; a
    reader in another thread meanwhile converts them too, so no reader sees a label: str is idempotent)."""
    for args in self.unnamed or ():
      args["copy"] = str(args["copy"])
    self.unnamed = None


class Trace:
  """The timeline of one launch. `add((tid, unit, name, start_cycle, end_cycle, args))` records one
  event (tid = (chip, core); args None or a dict): the only way events are made. It is the append of a
  deque that keeps the newest `cap` events, which bounds memory, and a C call, so recording costs the
  hot paths (every op, DMA and wait) no Python frame. `events` is the launch's EventLog: the kept
  events in order, behind a truncation marker when older ones were dropped."""
  __slots__ = ("on", "add", "cap", "stats", "_ring", "_dma_bytes", "_dma_count")

  def __init__(self, on: bool = True, cap: int = 200_000):
    self.on = on
    self.cap = cap
    self._ring = collections.deque(maxlen=cap)
    self.add = self._ring.append
    self.stats = {"dma_bytes": {}, "dma_count": {}}
    self._dma_bytes = self.stats["dma_bytes"]
    self._dma_count = self.stats["dma_count"]

  @property
  def events(self) -> EventLog:
    """The kept events, for the launch's report. A DMA event is recorded with its request (`{"copy":
    DmaRequest}`: naming it costs the hot path nothing); the report gets the request's label instead
    (executor.CopyLabel: names and indices), so it holds no buffer of the launch: a process running
    launch after launch in one `virtual_tpu` keeps every report, and a request would keep that launch's
    HBM operands, outputs and VMEM alive with it (about an output's size per launch, without bound).
    The labels become text when the report's events are first read (`Report.events`): formatting
    every copy's windows cost more per DMA than timing it."""
    log = EventLog()
    log.stats = self.stats
    ring = self._ring
    if len(ring) == self.cap and ring:
      first = ring[0]
      log.append((first[0], "scalar", f"trace truncated: only the last {self.cap:,} events are kept",
                  first[3], first[3], None))
    log.extend(ring)
    named = {}   # id(request) -> its label (pipelines reuse one request per block slot)
    unnamed = []
    for args in filter(None, map(_ARGS, log)):   # (events without args are skipped at C level)
      req = args.get("copy")
      if req is not None and type(req) is not str:
        label = named.get(id(req))
        if label is None:
          label = named[id(req)] = req.label()
        args["copy"] = label
        unnamed.append(args)
    log.unnamed = unnamed or None
    return log

  def count_dma(self, kind: str, nbytes: int, copies: int = 1) -> None:
    """`copies` DMAs of `kind` moving `nbytes` in all (kept whether or not tracing is on)."""
    per_kind = self._dma_bytes
    per_kind[kind] = per_kind.get(kind, 0) + int(nbytes)
    per_kind = self._dma_count
    per_kind[kind] = per_kind.get(kind, 0) + copies


def thread_id(core, unit: str) -> int:
  """Chrome-trace thread of (core, unit): 32 per core, units in UNIT_ORDER."""
  unit_idx = UNIT_ORDER.index(unit) if unit in UNIT_ORDER else len(UNIT_ORDER)
  return int(core) * 32 + unit_idx


def to_chrome_trace(events, clock_hz: float, kernel_name: str, offset_cycles: float = 0,
                    chip_name: str = "", metadata=None) -> dict:
  """Chrome trace JSON: one process per chip, one thread per (core, unit); times in microseconds.

  Complete ('X') events carry the unit as category and the cycle numbers in args; metadata ('M') events
  name and order the processes and threads."""
  out = []
  seen_pid, seen_tid = set(), set()
  us = 1e6 / clock_hz
  for (chip, core), unit, name, start, end, args in events:
    pid = int(chip)
    tid = thread_id(core, unit)
    if pid not in seen_pid:
      seen_pid.add(pid)
      label = f"chip {pid}" + (f" ({chip_name})" if chip_name else "")
      out.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": label}})
      out.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    if (pid, tid) not in seen_tid:
      seen_tid.add((pid, tid))
      out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                  "args": {"name": f"core {core} {_UNIT_LABEL.get(unit, unit)}"}})
      out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                  "args": {"sort_index": tid}})
    ev = {"ph": "X", "pid": pid, "tid": tid, "name": str(name), "cat": unit,
          "ts": round((start + offset_cycles) * us, 4), "dur": round(max(end - start, 0) * us, 4)}
    ev_args = {"start_cycle": start, "end_cycle": end}
    if args:
      ev_args.update({k: (v if isinstance(v, (int, float, str)) else str(v)) for k, v in args.items()})
    ev["args"] = ev_args
    out.append(ev)
  other = {"kernel": kernel_name, "clock_hz": clock_hz}
  if chip_name:
    other["chip"] = chip_name
  other.update(metadata or {})
  return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": other}


def write_json(obj, path) -> None:
  with open(path, "w") as f:
    json.dump(obj, f)
