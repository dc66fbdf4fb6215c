"""The chip's in-kernel timelines (benchmarks/hw/regions.py, recorded 2026-12-07 on a TPU v5e with
libtpu's custom-call region trace; read by benchmarks/hw/regions_read.py): what they show about a grid
step, checked on the recorded files (no TPU). docs/validation.md "Session 31" has the figures."""
import functools
import statistics

import pytest

from benchmarks.hw import chip_wheel, regions_read

_RUNS = {(c.name, c.variant): c for c in regions_read.load()}


def _plain(name):
  return _RUNS[(name, "plain")]


def _segment_medians(name, period):
  """Per step position: the longest segment's median cycles."""
  return [max(segs.values()) for segs in regions_read.by_position(_plain(name), period).values()]


def test_the_region_files_name_their_chip_jax_and_flags():
  import glob
  import gzip
  import json
  paths = glob.glob(f"{regions_read.DATA}/regions-*.jsonl.gz")
  assert len(paths) >= 2
  for p in paths:
    with gzip.open(p, "rt") as f:
      env = json.loads(f.readline())
    assert env["kind"] == "environment" and env["device_kind"] == "TPU v5 lite"
    assert env["jax_version"] == chip_wheel.CHIP_JAX and env["date"] == "2026-12-07"
    assert "--xla_enable_custom_call_region_trace=true" in env["libtpu_init_args"]


@pytest.mark.parametrize("name", ["mmst_tut", "mmst_none", "osw_fixed_k8", "oheavy_k8", "cshape_bf16_r128"])
def test_the_steps_between_markers_add_up_to_the_kernel(name):
  """The intervals between passes of the loop's first marker are the grid steps: 512 of them (less the
  last) whose mean is the kernel's time over its 512 steps, within 1%."""
  run = _plain(name)
  steps = run.step_cycles
  assert len(steps) == 513
  assert abs(statistics.mean(steps) / (run.kernel_cycles / 512) - 1) < 0.01


def test_a_latency_bound_pipeline_alternates_long_and_short_steps_on_the_chip():
  """mmst_none (two 32 KiB copies a step, no work): a step whose copies landed during the long step
  before it barely waits (137-195 cycles), the next waits for its copies' round trip (577-727): the
  period-2 pattern palace's latency-form candidate rule produces and its sync form does not."""
  first = _plain("mmst_none").step_cycles[:8]
  assert all(long > 2.5 * short for long, short in zip(first[0::2], first[1::2]))
  assert max(first[1::2]) < 200 and min(first[0::2]) > 550


def test_a_kept_blocks_write_back_is_waited_at_the_end_of_the_next_step_beside_light_steps():
  """out_switch K = 8 (light steps, a 64 KiB f32 output block changing every 8): one step in 8 waits
  ~375 cycles at its end (the step after the block's last: its body is the zeroing one), no other
  step waits more than 60; K = 2 the same every other step; out_heavy K = 8 (the flash step's body,
  ~564 cycles, after the change) waits nowhere outside its body."""
  k8 = sorted(_segment_medians("osw_fixed_k8", 8))
  assert 350 < k8[-1] < 400 and k8[-2] < 60
  k2 = sorted(_segment_medians("osw_fixed_k2", 2))
  assert 350 < k2[1] < 400 and k2[0] < 60
  heavy = regions_read.by_position(_plain("oheavy_k8"), 8)
  for segs in heavy.values():
    body = max(segs.values())
    assert 550 < body < 600 and sorted(segs.values())[-2] < 30


def test_the_bf16_single_row_gather_waits_for_no_copy_on_the_chip():
  """grow1_bf16 (the +641% point): after XLA's relayout its kernel's steps cost 38 cycles with no
  segment over 30 (no DMA wait at all), where the f32 twin waits 340-420 cycles every step: XLA ran it
  on operands it had copied (copy-start / copy-done around the relayout), so the pipeline's copies do
  not go to HBM."""
  bf16 = _plain("grow1_bf16_2048x2048_n512")
  assert max(statistics.median(bf16.step_cycles), max(_segment_medians(bf16.name, 8))) < 40
  f32 = _segment_medians("gather_f32_rows1_8192x1024_n1024", 8)
  assert min(f32) > 300


def test_a_scoped_body_is_one_trace_region_a_grid_step():
  assert len(_RUNS[("mmst_tut", "scoped")].bodies) == 512


def test_the_wheels_causal_flash_steps_on_the_chip():
  """flash_causal_b2h8s1024d128 (the jax wheel's kernel as the chip ran it, no scope of ours): the
  masked-out steps cost 145-182 cycles, the running ones ~733 (as the non-causal launch's, 703-752),
  and a q row's first step pays its new q block's round trip (1100-1700)."""
  causal = sorted(_plain("flash_causal_b2h8s1024d128").step_cycles)
  full = _plain("flash_full_b2h8s1024d128").step_cycles
  n = len(causal)
  assert 140 < causal[n // 4] < 190 and 700 < statistics.median(full) < 760
  assert 1000 < causal[-n // 20] < 1800


def test_the_512_block_causal_flash_pays_nothing_for_its_mask_on_the_chip():
  """Session 34's trace of flash_causal_b1h8s2048d128_blk512 (palace +27%): its running steps cost
  ~1540 cycles, less than the non-causal launch's (1590-1640 past a row's first): the causal mask on
  512 x 512 scores is hidden, where palace charges ~450 cycles for it (2123 a running step); skipped
  steps 140-180, a q row's first step 2450-3050 (its q block's round trip)."""
  causal = _plain("flash_causal_b1h8s2048d128_blk512").step_cycles
  full = _plain("flash_full_b1h8s2048d128_blk512").step_cycles
  running = [c for c in causal if 1400 < c < 2000]
  assert len(running) >= 40 and 1500 < statistics.median(running) < 1560
  assert 1580 < statistics.median(full) < 1650
  assert sum(130 < c < 190 for c in causal) >= 40 and sum(2400 < c < 3100 for c in causal) >= 20


def test_a_grid_steps_bookkeeping_grows_with_operands_and_computed_maps_on_the_chip():
  """Session 32's step_book traces (4096 steps, blocks never moving, body skipped): one input and one
  output on a 1-D grid ~37 cycles a step; the 4-D grid with 3 inputs and 3 outputs ~69; the same 4-D
  grid with 3 inputs whose maps compute (the wheel's causal clamp) ~127: maps the compiler evaluates
  cost far more than the grid's rank or the operand count (docs/validation.md "Session 32")."""
  med = {n: statistics.median(_plain(n).step_cycles[4:]) for n in
         ("book_r1_i1_o1", "book_r4_i3_o3", "book_r4_i3_o1_sel")}
  assert 35 <= med["book_r1_i1_o1"] <= 39
  assert 66 <= med["book_r4_i3_o3"] <= 72
  assert 120 <= med["book_r4_i3_o1_sel"] <= 132


def test_serial_hbm_reads_stall_in_clusters_a_refresh_period_apart_and_writes_never():
  """Session 32's traces of the serial copy loops (start, wait, next; 2048 copies of 4 KiB): a read's
  round trip is 480 cycles at the median, but about one in six is ~270 cycles longer, the long ones in
  clusters ~5000-5500 cycles apart (an HBM refresh period, 3.9 us, is 5850): +44 cycles a read on
  average. The same loop of writes never stalls (docs/validation.md "Session 32")."""
  for name in ("probe_read_seq_4KiB_x2048", "probe_read_seq_16KiB_x1024"):
    steps = _plain(name).step_cycles
    med = statistics.median(steps)
    long = [s for s in steps if s > med + 100]
    assert 0.10 < len(long) / len(steps) < 0.25, name
    assert 200 < statistics.median(long) - med < 350, name
    assert 35 < statistics.mean(steps) - med < 55, name
  writes = _plain("probe_write_seq_4KiB_x2048").step_cycles
  assert max(writes) - statistics.median(writes) < 10


@functools.cache
def _scoped_launch(name):
  """The events of a recorded plain launch whose kernel has jax.named_scope regions (sessions 33-34)."""
  import gzip
  import json
  for tag in ("m", "l", "h", "j"):
    with gzip.open(f"{regions_read.DATA}/regions-2026-12-07-{tag}.jsonl.gz", "rt") as f:
      for line in f:
        rec = json.loads(line)
        if rec.get("name") == name and rec.get("variant") == "plain":
          return rec["events_first_launch"]
  raise KeyError(name)


def _scope_cycles(name, scope):
  """Cycles of each `scope` region (jax.named_scope inside the kernel) of a recorded plain launch."""
  return [e[3] * regions_read.CLOCK_HZ / 1e6 for e in _scoped_launch(name) if e[0] == scope]


def test_a_burst_of_copies_issues_in_a_few_cycles_a_copy_until_the_engine_backs_up():
  """Session 33's traces of bursts (rounds of k 4 KiB HBM->VMEM copies started back to back, then
  waited): 4 / 16 starts take ~6 / ~37 cycles (1.4-2.3 a copy), 64 take ~517 (8 a copy: issue waits
  for the engine, which moves a 4 KiB copy every ~8.5 cycles); each page number read from SMEM first
  makes it ~4.2 a copy; the round's waits take ~500-660 cycles (docs/validation.md "Session 33")."""
  med = {k: statistics.median(_scope_cycles(f"isr_4KiB_k{k}_x{n}", "starts"))
         for k, n in ((4, 64), (16, 32), (64, 8))}
  assert med[4] < 10 and 30 < med[16] < 45 and 480 < med[64] < 560
  paged = statistics.median(_scope_cycles("isr_4KiB_k16_x32_paged", "starts"))
  assert 60 < paged < 75
  for k, n in ((4, 64), (16, 32), (64, 8)):
    assert 480 < statistics.median(_scope_cycles(f"isr_4KiB_k{k}_x{n}", "waits")) < 620


def test_waiting_on_a_rebuilt_descriptor_costs_the_chip_nothing_more():
  """A wait whose descriptor is built again (its source page number loaded from SMEM again) runs as
  fast as waiting the started copy's own descriptor (within 1%): the wait's source is dead code on
  the chip, which palace.jax models (palace/_src/jax/wait_sources.py)."""
  from benchmarks.hw import model
  _, recs = model.load()
  for k in (16, 64):
    n = 128 if k == 16 else 32
    paged, rebuilt = (recs[f"iss_4KiB_k{k}_x{n}_{v}"]["measured_us"] for v in ("paged", "rebuilt"))
    assert rebuilt <= paged * 1.01, (k, paged, rebuilt)


def test_a_lone_dma_write_streams_faster_than_a_sustained_write_stream():
  """Session 33: a serial loop of 1 MiB DMA writes (start, wait, next) takes ~2426 cycles a write on
  the chip, round trip included; at the 651 GB/s of a sustained write stream 1 MiB alone takes 2416,
  and a 64 KiB write's loop leaves ~340 cycles of round trip: a lone write streams at ~750 GB/s. Four
  1 MiB writes back to back take ~9600 (~655 GB/s): the fast part is bounded (docs/validation.md
  "Session 33")."""
  steps = {}
  for name in ("probe_write_seq_1024KiB_x32", "probe_write_seq_64KiB_x256", "wburst_1024KiB_k4_x8"):
    marks = _plain(name).markers
    head = max(set(m for m, _ in marks), key=lambda m: sum(1 for n, _ in marks if n == m))
    ts = [t for m, t in marks if m == head]
    steps[name] = statistics.median([b - a for a, b in zip(ts, ts[1:])])
  assert 2400 < steps["probe_write_seq_1024KiB_x32"] < 2450
  assert 465 < steps["probe_write_seq_64KiB_x256"] < 485   # 151 cycles of data at 651 GB/s: ~320 more
  assert 9400 < steps["wburst_1024KiB_k4_x8"] < 9800


def _starts(name):
  return statistics.median(_scope_cycles(name, "starts"))


def test_starts_back_up_at_the_engines_copy_rate_and_a_page_walks_cost_more():
  """Session 34's traces: beyond ~12 starts in a burst each 4 KiB start waits ~10 cycles (the engine
  moves a copy of consecutive rows every ~10): 24 / 32 / 48 starts take ~116 / ~197 / ~356. Copies
  alternating two semaphores take ~3x as long to start as on one (16: ~125 against ~37), all of a
  page walk's forms at once (two sources and semaphores, a computed slot, under pl.when) ~260, and a
  page walk's 16 starts ~280-320 (2 starts ~4): docs/validation.md "Session 34"."""
  k = {24: _starts("isr_4KiB_k24_x32"), 32: _starts("isr_4KiB_k32_x16"), 48: _starts("isr_4KiB_k48_x8")}
  assert 105 < k[24] < 130 and 185 < k[32] < 210 and 340 < k[48] < 375
  assert 9 < (k[48] - k[24]) / 24 < 11
  assert 110 < _starts("isr_4KiB_k16_x32_2sem") < 140 and 240 < _starts("isr_4KiB_k16_x32_paged_walk") < 290
  assert 260 < _starts("pgr_light_c8_r16") < 300 and 300 < _starts("pgr_wheel_c8_r16_cross_dyn") < 330
  assert _starts("pgr_light_c1_r128") < 10


def test_in_a_stream_a_start_costs_a_few_cycles_unless_its_semaphore_alternates():
  """Session 35's traces (`sfr_*`: rounds of 16 4 KiB copies double-buffered, round r + 1's starts then
  round r's waits, so the engine always has work): 16 starts take ~38 cycles with static addresses, ~49
  with each page number from SMEM, ~66 with the slot and semaphore computed from the round, ~75 with the
  wheel's order (8 copies from K on K's semaphore, then 8 from V on V's), but ~234 when K and V copies
  alternate copy by copy (a page walk's order: ~15 a start). The round's period is the engine's all the
  same: ~340 cycles for consecutive rows, ~400 for random pages, whatever the form."""
  starts = {n: _starts(f"sfr_{n}") for n in ("seq_unroll_one", "page_unroll_one", "page_dyn_one",
                                                "page_dyn_kv", "page_dyn_alt", "page_unroll_kv")}
  assert 30 < starts["seq_unroll_one"] < 45 and 40 < starts["page_unroll_one"] < 58
  assert 55 < starts["page_dyn_one"] < 80 and 60 < starts["page_dyn_kv"] < 90
  assert 200 < starts["page_dyn_alt"] < 260
  assert starts["page_dyn_alt"] > 2.5 * starts["page_dyn_kv"]
  period = {}
  for n in starts:
    begin = [e[2] for e in _scoped_launch(f"sfr_{n}") if e[0] == "starts"]
    period[n] = statistics.median([(b - a) * regions_read.CLOCK_HZ / 1e6 for a, b in zip(begin, begin[1:])])
  assert 320 < period["seq_unroll_one"] < 360
  assert all(370 < period[n] < 420 for n in starts if n.startswith("page")), period


def test_a_walks_starts_cost_what_its_body_around_them_costs_not_their_order():
  """Session 35's second call: the light and the wheel-body page walks with every K page started before
  every V page (one semaphore switch a block): 16 starts take ~195 / ~338 cycles, against ~279 / ~317
  with K and V alternating, while the same starts in a stream with no work around them take ~75 (the
  wheel's order) or ~234 (alternating): in a walk the starts are not cheap whatever their order, so no
  rule on the start's form alone (docs/timing-model.md 1.6, `dma_issue_switch_cycles`) fits both."""
  assert 170 < _starts("pgr_light_c8_r16_kfirst") < 220
  assert 310 < _starts("pgr_wheel_c8_r16_dyn_kfirst") < 360
  assert _starts("pgr_wheel_c8_r16_dyn_kfirst") > 4 * _starts("sfr_page_dyn_kv")
