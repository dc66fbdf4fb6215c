"""Timeline records and Chrome-trace / Perfetto export (L4b)."""
from __future__ import annotations

import collections
import itertools
import json
import operator

from palace._src.executor import flat_label, label_text

UNIT_ORDER = ("scalar", "dma", "mxu", "vpu", "eup", "xlu", "vld", "vst", "ici")
_UNIT_LABEL = {"scalar": "scalar core", "dma": "DMA engines", "mxu": "MXU", "vpu": "VPU",
               "eup": "EUP", "xlu": "XLU", "vld": "vector load", "vst": "vector store", "ici": "ICI"}


_ARGS = operator.itemgetter(5)   # an event's args (None, a dict, or a DMA's (label, bytes): Trace.events)


class EventLog(list):
  """The event list of one launch, plus counters that are kept even when tracing is off:
  `stats["dma_bytes"]` and `stats["dma_count"]` map a direction ('hbm->vmem', ...) to totals."""
  __slots__ = ("stats", "dropped", "unnamed")

  def __init__(self):
    super().__init__()
    self.stats = {"dma_bytes": {}, "dma_count": {}}
    self.dropped = None   # (events, budget) once Report.drop_trace freed them
    self.unnamed = None   # positions of DMA events whose args are a flat label + (bytes,) (Trace.events)

  def name_copies(self) -> None:
    """Give every DMA event its args dict, {"copy": 'src -> dst', "bytes": n}, once, when a report's
    events are first read (a reader in another thread meanwhile converts them too, to the same dicts:
    no reader sees the compact form)."""
    texts = {}   # label -> its text (a pipeline's copies of one block slot share their label)
    for i in self.unnamed or ():
      ev = self[i]
      args = ev[5]
      if type(args) is tuple:
        label = args[:-1]
        text = texts.get(label)
        if text is None:
          text = texts[label] = label_text(label)
        self[i] = (ev[0], ev[1], ev[2], ev[3], ev[4], {"copy": text, "bytes": args[-1]})
    self.unnamed = None


class Trace:
  """The timeline of one launch. `add((tid, unit, name, start_cycle, end_cycle, args))` records one
  event (tid = (chip, core); args None, a dict, or a DMA's (request, bytes)): the only way events are
  made. It is the append of a deque that keeps the newest `cap` events, which bounds memory, and a C
  call, so recording costs the hot paths (every op, DMA and wait) no Python frame. `events` is the
  launch's EventLog: the kept events in order, behind a truncation marker when older ones were
  dropped."""
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
    """The kept events, for the launch's report. A DMA is recorded with its request and byte count as
    args (`(DmaRequest, bytes)`: naming it costs the hot path nothing); the report gets the request's
    label instead (executor.flat_label: names and indices), so it holds no buffer of the launch:
    a process running launch after launch in one `virtual_tpu` keeps every report, and a request would
    keep that launch's HBM operands, outputs and VMEM alive with it (about an output's size per launch,
    without bound). A kept DMA event's args stay the tuple `flat_label(request) + (bytes,)` until the
    report's events are first read (`Report.events` -> `EventLog.name_copies` makes the args dicts and
    formats the labels: formatting every copy's windows cost more per DMA than timing it). Its args
    hold only names, numbers and Nones, so the first young collection stops tracking them and the
    next one the event: the events of the reports a process keeps neither count towards nor get
    rescanned by its full collections. (With an args dict and a label object per DMA they did: full
    collections were 9% of paged attention's mean launch time through palace.jax; with nested label
    tuples, one collection per level of nesting, ~100 events of paged attention a launch reached the
    oldest generation until session 26.)"""
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
    # (the positions of events with args, found at C level: most events have none)
    for i in itertools.compress(range(len(log)), map(_ARGS, log)):
      ev = log[i]
      args = ev[5]
      if type(args) is tuple:   # a DMA: (request, bytes)
        req = args[0]
        label = named.get(id(req))
        if label is None:
          label = named[id(req)] = flat_label(req)
        log[i] = (ev[0], ev[1], ev[2], ev[3], ev[4], label + (args[1],))   # (flat: see the docstring)
        unnamed.append(i)
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
