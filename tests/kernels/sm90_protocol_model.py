"""A model of the sm90 kernel's synchronisation, run under random timing (tests/test_sm90_protocol.py).

It mirrors, step by step, what ``kernel_src/sm90`` does with mbarriers, named barriers, TMA
loads and stores and wgmma groups: the producer thread of every CTA (``producer_loads``), every
consumer warp (``Consumer::run``, both loops, the causal skip, ping-pong turns, the epilogue and
the persistent CTA's one or two Q stages), the 2-CTA cluster's multicast halves and remote arrivals, and
the dynamic scheduler (``scheduler=1``): the CTAs of a grid run together, their producers take units
from one shared tile counter and hand each unit's id to the consumers next to its Q stage, -1 when
none is left.
Every asynchronous operation (a TMA load landing, a TMA store reading shared memory, a wgmma
group completing) is an agent of its own that finishes after a random number of steps, and the
scheduler runs a random ready agent at every step.

What it checks, at every step:
- every wgmma and TMA store reads exactly the tile it should (tagged by work unit and key
  block), and nothing writes a tile while it is read or written (TMA or ordinary stores);
- every mbarrier wait asks about the phase the code means: a parity wait is answered right only
  while the barrier is at that phase or one past it (``MBarrier.passed``), and TMA bytes land in
  the phase they were armed for;
- no more arrivals than a barrier expects, no deadlock, nothing in flight into or out of a CTA
  after it exited;
- at the end, every warpgroup's O of every work unit was stored exactly once, from its rows,
  after every key block it sees went through S = Q K^T and O += P V;
- dynamic scheduler: every consumer warp reads the unit id written for the phase it waited for, no
  id is overwritten before every consumer warp read it, the grid takes every unit exactly once, and
  the tile counter is back to zero at the end.

``FAULTS`` are deliberate bugs the tests plant to show that the model catches them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["DYNAMIC_FAULTS", "FAULTS", "Knobs", "ProtocolError", "Shape", "TileCounter", "simulate"]


class ProtocolError(AssertionError):
    """The modelled kernel broke its synchronisation (or the model found a deadlock)."""


#: deliberate bugs, by name: what the kernel would do wrong
FAULTS = {
    "release_before_store_read": "hand a Q stage back without waiting for the O store that reads it",
    "release_q_after_last_s_gemm": "hand the Q stage back after the unit's last S GEMM although O is staged in it",
    "one_q_stage_held_over": "q_stages = 1: the Q stage held over to the next unit's first S GEMM, as with two",
    "kv_ahead_past_ring": "q_stages = 1: one K/V block more than the ring's depth loaded ahead of the unit's Q",
    "skip_without_wait": "for a unit without key blocks, complete q_full without waiting for the stage",
    "no_arrive_for_empty_unit": "for a unit without key blocks, do not complete q_full at all",
    "no_store_drain": "exit without waiting for the last O store",
    "kv1_v_bytes_missing": "kv_barriers = 1: V's bytes left out of the shared barrier's count",
    "kv1_release_after_k": "kv_barriers = 1: the stage released after K instead of after V",
    "unit_after_arrive": "dynamic: write a unit's id next to its Q stage after arriving on the stage's full barrier",
    "sentinel_without_wait": "dynamic: hand the consumers -1 without waiting for the stage to be free",
    "no_sentinel": "dynamic: the producer ends without handing the consumers -1",
    "no_retire": "dynamic: a CTA ends without counting itself done on the tile counter",
}
#: the faults of the dynamic scheduler (the others are planted into the static one)
DYNAMIC_FAULTS = frozenset({"unit_after_arrive", "sentinel_without_wait", "no_sentinel", "no_retire"})


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """The knobs that change the synchronisation (search_spaces/sm90.toml)."""

    consumer_wgs: int = 2
    block_n: int = 128
    kv_stages: int = 2
    kv_barriers: int = 2
    cta_mode: int = 1
    persistent: bool = False
    q_stages: int = 2  # the knob: a persistent CTA's Q stages (config.cuh FT_Q_STAGES)
    pingpong: bool = False
    intra_wg_overlap: bool = True
    pv_split: bool = False
    scheduler: int = 0  # 1: dynamic (tile_scheduler.cuh FT_SCHEDULER)
    faults: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}")
        if self.pv_split and self.intra_wg_overlap:
            raise ValueError("pv_split splits the serial loop's P.V")
        if self.pingpong and self.consumer_wgs < 2:
            raise ValueError("ping-pong needs two consumer warpgroups")
        if self.q_stages not in (1, 2) or (self.q_stages == 1 and not self.persistent):
            raise ValueError("q_stages: 1 or 2, and 1 only in a persistent CTA")
        if self.scheduler and not (self.persistent and self.cta_mode == 1):
            raise ValueError("the dynamic scheduler needs persistent CTAs and cta_mode = 1")

    @property
    def block_m(self) -> int:
        return 64 * self.consumer_wgs

    @property
    def q_ring_stages(self) -> int:  # config.cuh kQStages
        return self.q_stages if self.persistent else 1


@dataclass(frozen=True, kw_only=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    causal: bool


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- work units (tile_scheduler.cuh, block_info.cuh) ----------------------------------------------
@dataclass(frozen=True)
class Unit:
    index: int  # the scheduler's unit number: the same for both CTAs of a cluster
    m_block: int
    head: int
    batch: int
    n_block_max: int
    first_row0: int  # first query row of the CTA
    offset: int  # seqlen_k - seqlen_q
    causal: bool
    block_n: int

    def has_rows(self, first_row: int, seqlen_q: int) -> bool:
        """BlockInfo::has_rows for one warpgroup's 64 rows: does one of them lie in [0, seqlen_q)?"""
        return first_row < seqlen_q and first_row + 64 > 0

    def visible(self, first_row: int) -> int:
        """BlockInfo::n_block_visible for one warpgroup's 64 rows."""
        if not self.causal:
            return self.n_block_max
        keys = first_row + 64 + self.offset
        return 0 if keys <= 0 else min(self.n_block_max, _ceil_div(keys, self.block_n))


def _unit(k: Knobs, s: Shape, index: int, rank: int) -> Unit:
    m_groups = _ceil_div(s.seqlen_q, k.block_m * k.cta_mode)
    m_block = (m_groups - 1 - index % m_groups) * k.cta_mode + rank
    head, batch = (index // m_groups) % s.heads_q, index // m_groups // s.heads_q
    n_block_max = _ceil_div(s.seqlen_k, k.block_n)
    shift = 0  # causal: the padding, in steps of lcm(64, block_n), lies before row 0 (block_info.cuh)
    if s.causal:
        step = math.lcm(64, k.block_n)
        shift = (m_groups * k.block_m * k.cta_mode - s.seqlen_q) // step * step
        group_end = (m_block // k.cta_mode + 1) * k.cta_mode * k.block_m - shift
        keys = min(group_end, s.seqlen_q) + s.seqlen_k - s.seqlen_q
        n_block_max = 0 if keys <= 0 else min(n_block_max, _ceil_div(keys, k.block_n))
    first_row0 = m_block * k.block_m - shift
    return Unit(index, m_block, head, batch, n_block_max, first_row0, s.seqlen_k - s.seqlen_q, s.causal, k.block_n)


def cluster_units(k: Knobs, s: Shape, clusters: int) -> list[list[int]]:
    """The unit numbers each cluster takes, in order (persistent: rounds of ``clusters`` units, in a snake:
    cluster c takes unit r n + c in even rounds r and r n + n - 1 - c in odd ones, as tile_scheduler.cuh)."""
    units = total_units(k, s)
    if not k.persistent:
        return [[u] for u in range(units)]
    n = min(clusters, units)
    out = []
    for c in range(n):
        taken, r = [], 0
        while (u := r * n + (n - 1 - c if r % 2 else c)) < units:
            taken.append(u)
            r += 1
        out.append(taken)
    return out


def total_units(k: Knobs, s: Shape) -> int:
    return _ceil_div(s.seqlen_q, k.block_m * k.cta_mode) * s.heads_q * s.batch


class TileCounter:
    """The dynamic scheduler's counter in global memory (TileScheduler::fetch / retire): [0] units taken,
    [1] CTAs done; each step of the model is atomic, as atomicAdd is."""

    def __init__(self) -> None:
        self.words = [0, 0]

    def fetch(self) -> int:
        self.words[0] += 1
        return self.words[0] - 1

    def retire(self, ctas: int) -> None:
        self.words[1] += 1
        if self.words[1] == ctas:  # the last CTA: zero for the next launch
            self.words = [0, 0]


# ---- simulated hardware -----------------------------------------------------------------------
class MBarrier:
    """An mbarrier: expected arrivals, a transaction count, and the number of completed phases."""

    def __init__(self, name: str, count: int, cta: Cta) -> None:
        self.name, self.count, self.pending, self.tx, self.completed, self.cta = name, count, count, 0, 0, cta

    def arrive(self) -> None:
        self.cta.check_alive(f"arrive on {self.name}")
        if self.pending <= 0:
            raise ProtocolError(f"{self.name}: an arrival beyond the {self.count} its phase expects")
        self.pending -= 1
        self._maybe_complete()

    def expect_tx(self, nbytes: int) -> None:
        self.tx += nbytes

    def complete_tx(self, nbytes: int, phase: int) -> None:
        self.cta.check_alive(f"TMA bytes on {self.name}")
        if self.completed != phase:
            raise ProtocolError(f"{self.name}: TMA bytes armed for phase {phase} land in phase {self.completed}")
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def passed(self, phase: int) -> bool:
        """A parity wait for the completion of ``phase`` (-1: the phase before the first one): the
        hardware compares parities only, which is right while the barrier is at ``phase`` or past it
        by one."""
        if not phase <= self.completed <= phase + 1:
            raise ProtocolError(
                f"{self.name}: a parity wait for phase {phase} while {self.completed} phases "
                "completed: the parity answers for another phase"
            )
        return self.completed == phase + 1


class NamedBarrier:
    """bar.sync / bar.arrive: completes when `threads` arrived (counted in warps of 32)."""

    def __init__(self, name: str, threads: int) -> None:
        self.name, self.threads, self.arrived, self.generation = name, threads, 0, 0

    def arrive(self) -> int:
        generation = self.generation
        self.arrived += 32
        if self.arrived > self.threads:
            raise ProtocolError(f"{self.name}: more than {self.threads} threads arrived")
        if self.arrived == self.threads:
            self.generation, self.arrived = self.generation + 1, 0
        return generation


class Slot:
    """A tile in shared memory: `parts` independently written pieces (a cluster's K/V halves, or a
    warpgroup's four warps of O), a content tag per part, reads and writes in flight."""

    def __init__(self, name: str, parts: int, cta: Cta) -> None:
        self.name, self.cta = name, cta
        self.content: list[object] = [None] * parts
        self.writing = [0] * parts
        self.readers: dict[object, int] = {}

    def _no_readers(self, what: str) -> None:
        if self.readers:
            raise ProtocolError(f"{self.name}: {what} while it is read by {sorted(map(str, self.readers))}")

    def begin_write(self, part: int, what: str) -> None:
        self.cta.check_alive(f"write into {self.name}")
        self._no_readers(what)
        if self.writing[part]:
            raise ProtocolError(f"{self.name}: {what} while another write into it is in flight")
        self.writing[part] += 1

    def end_write(self, part: int, tag: object) -> None:
        self.cta.check_alive(f"a TMA load landing in {self.name}")
        self.writing[part] -= 1
        self.content[part] = tag

    def write_now(self, part: int, tag: object, what: str) -> None:  # ordinary st.shared
        self._no_readers(what)
        if any(self.writing):
            raise ProtocolError(f"{self.name}: {what} while a TMA load into it is in flight")
        self.content[part] = tag

    def begin_read(self, reader: object, tag: object, what: str) -> None:
        if any(self.writing):
            raise ProtocolError(f"{self.name}: {what} while a TMA load into it is in flight")
        if any(c != tag for c in self.content):
            raise ProtocolError(f"{self.name}: {what} expects {tag}, the tile holds {self.content}")
        self.readers[reader] = self.readers.get(reader, 0) + 1

    def end_read(self, reader: object) -> None:
        self.readers[reader] -= 1
        if not self.readers[reader]:
            del self.readers[reader]


class Ring:
    """PipelineState: stage index and phase parity, plus the model's own count of uses (`use`:
    how many times this side went through the stage before, i.e. the phase it means)."""

    def __init__(self, stages: int) -> None:
        self.stages, self.advances = stages, 0

    @property
    def index(self) -> int:
        return self.advances % self.stages

    @property
    def phase(self) -> int:
        return (self.advances // self.stages) & 1

    @property
    def use(self) -> int:
        return self.advances // self.stages

    def advance(self) -> None:
        self.advances += 1

    def copy(self) -> Ring:
        r = Ring(self.stages)
        r.advances = self.advances
        return r


@dataclass
class Group:  # one wgmma group of a warpgroup: issued and committed by its 4 warps
    name: str
    slots: list[Slot] = field(default_factory=list)
    committed: set[int] = field(default_factory=set)
    done: bool = False


class Cta:
    def __init__(self, model: Model, rank: int, units: list[int]) -> None:
        k = model.knobs
        self.model, self.rank, self.name = model, rank, f"cta{rank}"
        self.units = [_unit(k, model.shape, u, rank) for u in units]  # dynamic: appended as the producer takes them
        self.exited = False
        # dynamic scheduler: SharedStorage::q_unit, (unit id, the stage's use it was written for), and which
        # consumer warps (wg, warp) read it
        self.q_unit: list[tuple[int, int] | None] = [None] * k.q_ring_stages
        self.q_unit_readers: list[set[tuple[int, int]]] = [set() for _ in range(k.q_ring_stages)]
        self.q_full = [MBarrier(f"{self.name}.q_full[{i}]", 1, self) for i in range(k.q_ring_stages)]
        self.q_empty = [MBarrier(f"{self.name}.q_empty[{i}]", k.consumer_wgs, self) for i in range(k.q_ring_stages)]
        arrivals = 4 * k.consumer_wgs * k.cta_mode  # every consumer warp of every CTA that reads the stage
        self.k_full = [MBarrier(f"{self.name}.k_full[{i}]", 1, self) for i in range(k.kv_stages)]
        self.k_empty = [MBarrier(f"{self.name}.k_empty[{i}]", arrivals, self) for i in range(k.kv_stages)]
        self.v_full = [MBarrier(f"{self.name}.v_full[{i}]", 1, self) for i in range(k.kv_stages)]
        self.v_empty = [MBarrier(f"{self.name}.v_empty[{i}]", arrivals, self) for i in range(k.kv_stages)]
        self.qo = [
            [Slot(f"{self.name}.q[{i}] rows of wg{w}", 4, self) for w in range(k.consumer_wgs)]
            for i in range(k.q_ring_stages)
        ]
        self.k = [Slot(f"{self.name}.k[{i}]", k.cta_mode, self) for i in range(k.kv_stages)]
        self.v = [Slot(f"{self.name}.v[{i}]", k.cta_mode, self) for i in range(k.kv_stages)]
        self.turn = [NamedBarrier(f"{self.name}.turn{w}", 256) for w in range(k.consumer_wgs)]
        self.epilogue = [NamedBarrier(f"{self.name}.epilogue{w}", 128) for w in range(k.consumer_wgs)]
        self.groups: list[list[Group]] = [[] for _ in range(k.consumer_wgs)]
        self.stores_in_flight = [0] * k.consumer_wgs  # of each warpgroup's storing thread

    def check_alive(self, what: str) -> None:
        if self.exited:
            raise ProtocolError(f"{self.name}: {what} after the CTA exited")


Cond = Callable[[], bool] | None


class Agent:
    def __init__(self, name: str, gen: Iterator[Cond]) -> None:
        self.name, self.gen, self.cond, self.done = name, gen, None, False

    def where(self) -> str:
        g = self.gen
        while getattr(g, "gi_yieldfrom", None) is not None:
            g = g.gi_yieldfrom
        frame = getattr(g, "gi_frame", None)
        return f"{g.__name__}:{frame.f_lineno}" if frame else "finished"


class Model:
    """One cluster (or lone CTA) of the kernel running `units` under random timing. Dynamic scheduler: CTA
    `cluster` of a grid of `grid` taking its units from `counter`; the CTAs of the grid share `agents`, so
    that they run together."""

    def __init__(
        self,
        knobs: Knobs,
        shape: Shape,
        units: list[int],
        rng: random.Random,
        *,
        agents: list[Agent] | None = None,
        counter: TileCounter | None = None,
        cluster: int = 0,
        grid: int = 1,
    ) -> None:
        self.knobs, self.shape, self.rng = knobs, shape, rng
        self.agents: list[Agent] = [] if agents is None else agents
        self.counter, self.cluster, self.grid = counter, cluster, grid
        self.ctas = [Cta(self, r, units) for r in range(knobs.cta_mode)]
        self.stored: dict[tuple[int, int, int], int] = {}  # (unit, rank, wg) -> stores
        self.computed: dict[tuple[int, int, int], list[tuple[str, int]]] = {}
        self.exit_count = 0
        # latencies, in scheduler picks: drawn per run so that some runs have slow loads, some slow stores
        self.latency = {name: (0, rng.choice([1, 4, 16, 64])) for name in ("load", "store", "wgmma")}

    # -- scheduling -------------------------------------------------------------------------------
    def spawn(self, name: str, gen: Iterator[Cond]) -> None:
        self.agents.append(Agent(name, gen))

    def run(self, max_steps: int = 3_000_000) -> None:
        for _ in range(max_steps):
            live = self.agents
            if not live:
                return
            ready = [a for a in live if a.cond is None or a.cond()]
            if not ready:
                raise ProtocolError("deadlock: " + "; ".join(f"{a.name} at {a.where()}" for a in live))
            agent = self.rng.choice(ready)
            try:
                agent.cond = next(agent.gen)
            except StopIteration:
                agent.done = True
                live.remove(agent)
        raise ProtocolError(f"no end after {max_steps} steps")

    def delay(self, kind: str) -> Iterator[Cond]:
        lo, hi = self.latency[kind]
        for _ in range(self.rng.randint(lo, hi)):
            yield None

    @staticmethod
    def wait(bar: MBarrier, parity: int, phase: int) -> Iterator[Cond]:
        """mbarrier_wait(bar, parity), meaning the completion of `phase` (the model's own count)."""
        if parity != phase & 1:
            raise AssertionError(f"model error: parity {parity} for phase {phase} of {bar.name}")
        yield lambda: bar.passed(phase)

    # -- asynchronous operations ------------------------------------------------------------------
    def tma_load(
        self, dests: list[tuple[Slot, int]], bars: list[tuple[MBarrier, int]], tag: object, nbytes: int
    ) -> None:
        for slot, part in dests:
            slot.begin_write(part, f"TMA load of {tag}")

        def land() -> Iterator[Cond]:
            yield from self.delay("load")
            for slot, part in dests:
                slot.end_write(part, tag)
            for bar, phase in bars:
                bar.complete_tx(nbytes, phase)

        self.spawn(f"load {tag}", land())

    def wgmma_issue(
        self, cta: Cta, wg: int, warp: int, count: int, reads: list[tuple[Slot, object]], what: str
    ) -> None:
        """Warp `warp` issues into its warpgroup's group number `count` (its commits so far)."""
        groups = cta.groups[wg]
        if count == len(groups):
            groups.append(Group(f"{cta.name}.wg{wg}.{what}#{count}"))
        group = groups[count]
        for slot, tag in reads:
            if slot not in group.slots:
                slot.begin_read(group.name, tag, what)
                group.slots.append(slot)
            elif any(c != tag for c in slot.content):
                raise ProtocolError(f"{slot.name}: {what} of warp {warp} expects {tag}, the tile holds {slot.content}")

    def wgmma_commit(self, cta: Cta, wg: int, warp: int, count: int) -> None:
        group = cta.groups[wg][count]
        group.committed.add(warp)
        if len(group.committed) < 4:
            return
        previous = cta.groups[wg][count - 1] if count else None

        def complete() -> Iterator[Cond]:
            yield lambda: previous is None or previous.done  # groups complete in order
            yield from self.delay("wgmma")
            for slot in group.slots:
                slot.end_read(group.name)
            group.done = True

        self.spawn(group.name, complete())

    def tma_store(self, cta: Cta, wg: int, slot: Slot, unit: Unit) -> None:
        key = (unit.index, cta.rank, wg)
        reader = f"O store {key}"
        slot.begin_read(reader, ("O", unit.index), "TMA store of O")
        cta.stores_in_flight[wg] += 1

        def read() -> Iterator[Cond]:
            yield from self.delay("store")
            cta.check_alive("a TMA store reading shared memory")
            slot.end_read(reader)
            cta.stores_in_flight[wg] -= 1
            self.stored[key] = self.stored.get(key, 0) + 1

        self.spawn(reader, read())

    # -- the producer thread (mainloop.cuh producer_loads) ----------------------------------------------
    def producer(self, cta: Cta) -> Iterator[Cond]:
        k, faults = self.knobs, self.knobs.faults
        st, qs = Ring(k.kv_stages), Ring(k.q_ring_stages)
        # the loop's step: the next unit (dynamic: fetched once this one's loads are issued)
        for unit in self.dynamic_units(cta) if k.scheduler else cta.units:
            if unit.n_block_max <= 0:  # q_ring.producer_skip
                if "skip_without_wait" not in faults:
                    yield from self.wait(cta.q_empty[qs.index], qs.phase ^ 1, qs.use - 1)
                yield from self.publish_and_arrive(cta, qs, unit.index, "no_arrive_for_empty_unit" not in faults)
                qs.advance()
                yield None
                continue
            n = unit.n_block_max - 1
            if k.persistent and k.q_stages == 1:  # the first K/V blocks ahead of Q, at most the ring's depth
                for _ in range(min(unit.n_block_max, k.kv_stages + ("kv_ahead_past_ring" in faults))):
                    yield from self.load_kv_block(cta, unit, n, st)
                    n -= 1
            yield from self.wait(cta.q_empty[qs.index], qs.phase ^ 1, qs.use - 1)  # q_ring.producer_acquire
            bar = cta.q_full[qs.index]
            bar.expect_tx(1)

            def load_q(bar=bar, unit=unit) -> None:
                self.tma_load(
                    [(cta.qo[qs.index][w], p) for w in range(k.consumer_wgs) for p in range(4)],
                    [(bar, qs.use)],
                    ("Q", unit.index),
                    1,
                )

            yield from self.publish_and_arrive(cta, qs, unit.index, then=load_q)
            yield None
            for block in range(n, -1, -1):
                yield from self.load_kv_block(cta, unit, block, st)
            qs.advance()
        if k.scheduler:  # TileScheduler::retire, then -1 into the next stage once it is free
            if "no_retire" not in faults:
                self.counter.retire(self.grid)
            if "sentinel_without_wait" not in faults:
                yield from self.wait(cta.q_empty[qs.index], qs.phase ^ 1, qs.use - 1)
            yield from self.publish_and_arrive(cta, qs, -1, "no_sentinel" not in faults)
        yield from self.exit(cta)

    def load_kv_block(self, cta: Cta, unit: Unit, n: int, st: Ring) -> Iterator[Cond]:
        """K and V of key block n into the rings' next stage (the producer's load_kv)."""
        k, tile = self.knobs, 2  # bytes of a K or V tile, in halves of a 2-CTA cluster's shares
        if k.kv_barriers == 2:  # K and V each on their own ring's barriers
            for ring in ("k", "v"):
                full, empty = getattr(cta, f"{ring}_full"), getattr(cta, f"{ring}_empty")
                yield from self.wait(empty[st.index], st.phase ^ 1, st.use - 1)
                full[st.index].expect_tx(tile)
                full[st.index].arrive()
                self.load_kv_tile(ring, f"{ring}_full", st, (ring.upper(), unit.index, n), tile, cta.rank)
                yield None
        else:  # both on the K ring's
            yield from self.wait(cta.k_empty[st.index], st.phase ^ 1, st.use - 1)
            cta.k_full[st.index].expect_tx(tile if "kv1_v_bytes_missing" in k.faults else 2 * tile)
            cta.k_full[st.index].arrive()
            self.load_kv_tile("k", "k_full", st, ("K", unit.index, n), tile, cta.rank)
            self.load_kv_tile("v", "k_full", st, ("V", unit.index, n), tile, cta.rank)
            yield None
        st.advance()

    def dynamic_units(self, cta: Cta) -> Iterator[Unit]:
        """The units of a CTA under the dynamic scheduler: its own index first, then one fetched from the
        tile counter each time the producer asks for the next (TileScheduler::fetch)."""
        index, total = self.cluster, total_units(self.knobs, self.shape)
        while 0 <= index < total:
            unit = _unit(self.knobs, self.shape, index, cta.rank)
            cta.units.append(unit)  # the model's record: the consumers learn it from q_unit
            yield unit
            index = self.grid + self.counter.fetch()

    def publish_and_arrive(
        self, cta: Cta, qs: Ring, unit: int, arrive: bool = True, then: Callable[[], None] | None = None
    ) -> Iterator[Cond]:
        """Dynamic scheduler: the unit's id into q_unit of the stage, then the producer's arrival on the stage's
        full barrier and `then` (the Q load); the static scheduler: the arrival and `then` alone."""
        late = "unit_after_arrive" in self.knobs.faults
        if self.knobs.scheduler and not late:
            self.write_unit(cta, qs, unit)
        if arrive:
            cta.q_full[qs.index].arrive()
        if then is not None:
            then()
        if self.knobs.scheduler and late:
            yield None
            self.write_unit(cta, qs, unit)

    def write_unit(self, cta: Cta, qs: Ring, unit: int) -> None:
        readers = 4 * self.knobs.consumer_wgs
        if cta.q_unit[qs.index] is not None and len(cta.q_unit_readers[qs.index]) < readers:
            raise ProtocolError(
                f"{cta.name}.q_unit[{qs.index}]: unit {unit} written over unit {cta.q_unit[qs.index][0]}, which "
                f"{readers - len(cta.q_unit_readers[qs.index])} consumer warps have not read"
            )
        cta.q_unit[qs.index] = (unit, qs.use)
        cta.q_unit_readers[qs.index] = set()

    def read_unit(self, cta: Cta, qs: Ring, wg: int, warp: int) -> int:
        """A consumer warp's read of q_unit after its wait for the stage's full barrier (consumer_unit)."""
        written = cta.q_unit[qs.index]
        if written is None or written[1] != qs.use:
            raise ProtocolError(
                f"{cta.name}.q_unit[{qs.index}]: warp {warp} of wg{wg} waited for use {qs.use} of the stage and "
                f"reads {'no unit id' if written is None else f'the id written for use {written[1]}'}"
            )
        cta.q_unit_readers[qs.index].add((wg, warp))
        return written[0]

    def load_kv_tile(self, slots: str, full: str, st: Ring, tag: object, tile: int, rank: int) -> None:
        """CTA `rank`'s share of the tile, multicast into the same stage of every CTA of the cluster,
        its bytes completing on each one's full barrier of that stage (load_kv_tile)."""
        bars = [(getattr(c, full)[st.index], st.use) for c in self.ctas]
        self.tma_load([(getattr(c, slots)[st.index], rank) for c in self.ctas], bars, tag, tile // len(self.ctas))

    # -- a consumer warp (mainloop.cuh Consumer, epilogue.cuh) -------------------------------------------
    def consumer(self, cta: Cta, wg: int, warp: int) -> Iterator[Cond]:
        k, s, faults = self.knobs, self.shape, self.knobs.faults
        st, qs = Ring(k.kv_stages), Ring(k.q_ring_stages)
        held: list[int | None] = [None]  # StoreHeldStage::index
        commits = [0]  # this warp's wgmma commits: the number of its warpgroup's next group
        if k.pingpong and wg == k.consumer_wgs - 1:  # open_gemm_turns
            cta.turn[0].arrive()
        taken = 0
        while True:  # consumer_unit: the unit of stage qs, if any
            if k.scheduler:  # the id the producer wrote next to the stage, once its full barrier's phase completed
                yield from self.wait(cta.q_full[qs.index], qs.phase, qs.use)
                index = self.read_unit(cta, qs, wg, warp)
                if index < 0:
                    break
                unit = _unit(k, s, index, cta.rank)
            else:
                if taken == len(cta.units):
                    break
                unit = cta.units[taken]
                yield from self.wait(cta.q_full[qs.index], qs.phase, qs.use)  # Consumer::run
            taken += 1
            first_row = unit.first_row0 + wg * 64
            log = self.computed.setdefault((unit.index, cta.rank, wg), [])
            if unit.n_block_max > 0:
                n = unit.n_block_max
                if not k.pingpong:  # skip_masked_blocks: past the diagonal, or every block for padding rows
                    while n > (unit.visible(first_row) if unit.has_rows(first_row, s.seqlen_q) else 0):
                        yield from self.wait_k(cta, st)
                        self.release_k(cta, st)
                        yield from self.wait_v(cta, st)
                        self.release_v(cta, st)
                        st.advance()
                        n -= 1
                        yield None
                if n > 0:
                    ctx = (cta, wg, warp, unit, qs, held, commits, log)
                    if k.intra_wg_overlap:
                        yield from self.run_overlapped(ctx, st, n - 1)
                    else:
                        yield from self.run_serial(ctx, st, n - 1)
            # epilogue: store_o_lse
            yield from self.release_held(cta, wg, warp, held)
            cta.qo[qs.index][wg].write_now(warp, ("O", unit.index), f"warp {warp} stages O of unit {unit.index}")
            yield None
            generation = cta.epilogue[wg].arrive()
            yield lambda: cta.epilogue[wg].generation > generation  # noqa: B023 - waited on before the next loop
            if warp == 0 and unit.has_rows(first_row, s.seqlen_q):
                self.tma_store(cta, wg, cta.qo[qs.index][wg], unit)
            if k.persistent and "release_q_after_last_s_gemm" not in faults:
                held[0] = qs.index  # StoreHeldStage::hold
            yield None  # the LSE stores
            if k.q_ring_stages == 1 and "one_q_stage_held_over" not in faults:
                yield from self.release_held(cta, wg, warp, held)  # the next unit's Q goes into this stage
            qs.advance()
            yield None
        if k.pingpong and wg == 0:  # close_gemm_turns
            generation = cta.turn[0].arrive()
            yield lambda: cta.turn[0].generation > generation
        if warp == 0 and "no_store_drain" not in faults:  # drain_o_stores
            yield lambda: cta.stores_in_flight[wg] == 0
        yield from self.exit(cta)

    def release_held(self, cta: Cta, wg: int, warp: int, held: list[int | None]) -> Iterator[Cond]:
        if held[0] is None:
            return
        if warp == 0:  # the storing thread
            if "release_before_store_read" not in self.knobs.faults:
                yield lambda: cta.stores_in_flight[wg] == 0  # tma_store_wait_read
            cta.q_empty[held[0]].arrive()
        held[0] = None
        yield None

    def wait_k(self, cta: Cta, st: Ring) -> Iterator[Cond]:
        yield from self.wait(cta.k_full[st.index], st.phase, st.use)

    def wait_v(self, cta: Cta, st: Ring) -> Iterator[Cond]:
        if self.knobs.kv_barriers == 2:
            yield from self.wait(cta.v_full[st.index], st.phase, st.use)

    def _release(self, empty: str, st: Ring) -> None:
        for peer in self.ctas:  # lane r of the warp arrives on CTA r's barrier
            getattr(peer, empty)[st.index].arrive()

    def release_k(self, cta: Cta, st: Ring) -> None:
        if self.knobs.kv_barriers == 2 or "kv1_release_after_k" in self.knobs.faults:
            self._release("k_empty", st)

    def release_v(self, cta: Cta, st: Ring) -> None:
        if self.knobs.kv_barriers == 2:
            self._release("v_empty", st)
        elif "kv1_release_after_k" not in self.knobs.faults:
            self._release("k_empty", st)

    def turn_begin(self, cta: Cta, wg: int) -> Iterator[Cond]:
        if self.knobs.pingpong:
            generation = cta.turn[wg].arrive()
            yield lambda: cta.turn[wg].generation > generation

    def turn_end(self, cta: Cta, wg: int) -> None:
        if self.knobs.pingpong:
            cta.turn[(wg + 1) % self.knobs.consumer_wgs].arrive()

    def wgmma_wait(self, cta: Cta, wg: int, commits: list[int], pending: int) -> Iterator[Cond]:
        groups = cta.groups[wg]
        yield lambda: sum(not g.done for g in groups[: commits[0]]) <= pending

    def issue(self, ctx, what: str, n: int, st: Ring) -> None:
        cta, wg, warp, unit, qs, _, commits, log = ctx
        if what == "S":
            reads = [(cta.qo[qs.index][wg], ("Q", unit.index)), (cta.k[st.index], ("K", unit.index, n))]
        else:
            reads = [(cta.v[st.index], ("V", unit.index, n))]
        self.wgmma_issue(cta, wg, warp, commits[0], reads, f"{what}{n}")
        if warp == 0:
            log.append((what, n))

    def commit(self, ctx) -> None:
        cta, wg, warp, *_, commits, _ = ctx
        self.wgmma_commit(cta, wg, warp, commits[0])
        commits[0] += 1

    def qk_gemm(self, ctx, st: Ring, n: int) -> Iterator[Cond]:
        cta, wg, warp, _unit, qs, held, commits, _ = ctx
        yield from self.wait_k(cta, st)
        yield from self.turn_begin(cta, wg)
        self.issue(ctx, "S", n, st)
        self.commit(ctx)
        self.turn_end(cta, wg)
        yield None
        yield from self.release_held(cta, wg, warp, held)
        yield from self.wgmma_wait(cta, wg, commits, 0)
        self.release_k(cta, st)
        if n == 0 and "release_q_after_last_s_gemm" in self.knobs.faults and warp == 0:
            cta.q_empty[qs.index].arrive()
        yield None

    def pv_gemm(self, ctx, st: Ring, n: int) -> Iterator[Cond]:
        cta, wg, _, _, _, _, commits, _ = ctx
        yield from self.wait_v(cta, st)
        yield from self.turn_begin(cta, wg)
        self.issue(ctx, "PV", n, st)
        if self.knobs.pv_split:  # the second part of P.V after exponentiating the rest of P
            self.commit(ctx)
            yield None
            self.issue(ctx, "PV", n, st)
        self.commit(ctx)
        self.turn_end(cta, wg)
        yield None
        yield from self.wgmma_wait(cta, wg, commits, 0)
        self.release_v(cta, st)
        yield None

    def run_serial(self, ctx, st: Ring, n_first: int) -> Iterator[Cond]:
        for n in range(n_first, -1, -1):
            yield from self.qk_gemm(ctx, st, n)
            yield from self.pv_gemm(ctx, st, n)
            st.advance()

    def run_overlapped(self, ctx, st: Ring, n_first: int) -> Iterator[Cond]:
        cta, wg, _, _, qs, _, commits, _ = ctx
        yield from self.qk_gemm(ctx, st, n_first)
        for n in range(n_first - 1, -1, -1):
            prev = st.copy()
            st.advance()
            yield from self.wait_k(cta, st)
            yield from self.turn_begin(cta, wg)
            self.issue(ctx, "S", n, st)
            self.commit(ctx)
            yield from self.wait_v(cta, prev)
            self.issue(ctx, "PV", n + 1, prev)
            self.commit(ctx)
            self.turn_end(cta, wg)
            yield None
            yield from self.wgmma_wait(cta, wg, commits, 1)
            self.release_k(cta, st)
            if n == 0 and "release_q_after_last_s_gemm" in self.knobs.faults and ctx[2] == 0:
                cta.q_empty[qs.index].arrive()
            yield None  # softmax of tile n while P.V of tile n + 1 runs
            yield from self.wgmma_wait(cta, wg, commits, 0)
            self.release_v(cta, prev)
            yield None
        yield from self.pv_gemm(ctx, st, 0)
        st.advance()

    # -- exit ---------------------------------------------------------------------------------------
    def exit(self, cta: Cta) -> Iterator[Cond]:
        """The end of a thread: a cluster's CTAs exit together (cluster_sync), a lone CTA when its
        last thread ends. The CTA's shared memory and barriers are gone from then on."""
        self.exit_count += 1
        threads = (1 + 4 * self.knobs.consumer_wgs) * len(self.ctas)  # the modelled ones
        if len(self.ctas) > 1:
            yield lambda: self.exit_count == threads
        if self.exit_count == threads:
            for c in self.ctas:
                c.exited = True

    def start(self) -> None:
        for cta in self.ctas:
            self.spawn(f"{cta.name}.producer", self.producer(cta))
            for wg in range(self.knobs.consumer_wgs):
                for warp in range(4):
                    self.spawn(f"{cta.name}.wg{wg}.warp{warp}", self.consumer(cta, wg, warp))

    def check_results(self) -> None:
        k, s = self.knobs, self.shape
        for cta in self.ctas:
            for unit in cta.units:
                for wg in range(k.consumer_wgs):
                    key = (unit.index, cta.rank, wg)
                    first_row = unit.first_row0 + wg * 64
                    want = 1 if unit.has_rows(first_row, s.seqlen_q) else 0
                    if self.stored.get(key, 0) != want:
                        raise ProtocolError(f"O of {key} stored {self.stored.get(key, 0)} times, not {want}")
                    if k.pingpong:
                        n = unit.n_block_max
                    elif not unit.has_rows(first_row, s.seqlen_q):  # every row is padding: nothing computed
                        n = 0
                    else:
                        n = min(unit.n_block_max, unit.visible(first_row))
                    blocks = sorted(b for what, b in self.computed.get(key, []) if what == "S")
                    pv = sorted(set(b for what, b in self.computed.get(key, []) if what == "PV"))
                    if blocks != list(range(n)) or pv != list(range(n)):
                        raise ProtocolError(f"{key}: S of key blocks {blocks}, P.V of {pv}; expected 0..{n - 1}")


def simulate(knobs: Knobs, shape: Shape, *, seed: int, clusters: int = 2) -> int:
    """Run every cluster of the grid (a persistent grid of `clusters` clusters) once under random
    timing drawn from `seed`; raise ProtocolError on the first violation. Returns the work units run."""
    rng = random.Random(seed)
    if knobs.scheduler:
        return _simulate_dynamic(knobs, shape, rng, clusters)
    ran = 0
    for units in cluster_units(knobs, shape, clusters):
        model = Model(knobs, shape, units, rng)
        model.start()
        model.run()
        model.check_results()
        ran += len(units)
    return ran


def _simulate_dynamic(knobs: Knobs, shape: Shape, rng: random.Random, clusters: int) -> int:
    """The dynamic scheduler: the grid's CTAs (as many as units, at most `clusters`) run together on one tile
    counter; every unit is taken exactly once, and the counter is zero again at the end."""
    total = total_units(knobs, shape)
    grid, counter, agents = min(clusters, total), TileCounter(), []
    models = [Model(knobs, shape, [], rng, agents=agents, counter=counter, cluster=c, grid=grid) for c in range(grid)]
    for model in models:
        model.start()
    models[0].run()  # every CTA's agents: the list is shared
    for model in models:
        model.check_results()
    taken = sorted(u.index for m in models for u in m.ctas[0].units)
    if taken != list(range(total)):
        raise ProtocolError(f"the grid took units {taken}, not each of 0..{total - 1} once")
    if counter.words != [0, 0]:
        raise ProtocolError(f"the tile counter ends at {counter.words}, not zeroed for the next launch")
    return total
