"""The SASS of sm90's key-block loop, counted on cubins built without a GPU (nvcc, then ``nvdisasm`` from PyPI's
``nvidia-cuda-nvdisasm``, a test extra).

The key-block loop is the loop of a consumer warpgroup that runs once per K/V tile (kernel_src/sm90/mainloop.cuh,
``run_overlapped``'s for-loop): the HGMMA instructions of S = Q K^T and O += P V and the MUFU.EX2 exponentials
of one key block. Its instructions per iteration are the issue slots a key block costs, which a knob that moves
code around the loop must not raise without paying for them (unit_overlap's first version lost 5-6% with 6.7% more,
BENCHMARKS.md, session 26): :func:`assert_loop_within` compares two builds' loops, and :func:`key_block_loop` finds
the loop in ``nvdisasm -c`` output.

What one key block holds, derived from the config (and what the builds show):

* HGMMA: each ``wgmma.mma_async`` k-step is one HGMMA instruction in SASS (``HGMMA.64x{N}x16.F32``; a k-step is
  K = 16), so head_dim / 16 of S = Q K^T (``HGMMA.64x{block_n}x16``) and block_n / 16 of O += P V
  (``HGMMA.64x{head_dim}x16``).
* MUFU.EX2: a thread holds block_n / 2 values of S (64 rows x block_n columns over 128 threads), one exponential
  each, less the poly_exp of every 8 computed on the FMA pipe; plus the row-max rescale's two (``o_scale``, one
  for each of the two rows a thread owns), which sit inside the loop behind the warp-uniform branch.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kernels.sm90_configs import SM90_REPRESENTATIVE
from tests.kernels.test_kernel_builds import _problem
from tuner.compile import compile_config
from tuner.devices import limits_for_arch
from tuner.space import complete, load_space

# ---- the SASS parser ---------------------------------------------------------------------------------------------

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s*(.*?)\s*;")
_LABEL = re.compile(r"^\s*([.\w$]+):\s*$")
_GUARD = re.compile(r"^(@!?U?P(?:T|\d+))\s+")
_TARGET = re.compile(r"`\(([^)]+)\)|\b(0x[0-9a-fA-F]+)\b")
#: opcodes after which, unguarded, control does not fall through (BRX, JMX: indirect, treated as leaving)
_NO_FALL_THROUGH = {"BRA", "JMP", "EXIT", "RET", "BRX", "JMX"}


@dataclass(frozen=True)
class Instruction:
    address: int
    guard: str | None  # "@P0", "@!UP1", ...; None when unguarded
    text: str  # without guard and ";"

    @property
    def opcode(self) -> str:
        return self.text.split(None, 1)[0]


@dataclass(frozen=True)
class Loop:
    start: int  # address of the loop's first instruction (the back edge's target)
    end: int  # address of its last (the backward branch)
    instructions: int  # instruction lines in [start, end]
    hgmma: int  # HGMMA instructions among them
    mufu: int  # MUFU.EX2 instructions among them (MUFU.EX2.F16 included)


def function_sass(sass_text: str, function: str = "flashtune_fwd") -> tuple[list[Instruction], dict[str, int]]:
    """The instructions of ``function`` in ``nvdisasm`` output, trailing NOP padding dropped, and its labels with
    the address each one names (that of the next instruction)."""
    instructions: list[Instruction] = []
    labels: dict[str, int] = {}
    pending: list[str] = []
    inside = False
    for line in sass_text.splitlines():
        stripped = line.strip()
        if stripped == f".text.{function}:":
            inside = True
        elif inside and (stripped.startswith("//--") or stripped.startswith(".section")):
            break
        elif inside and (label := _LABEL.match(line)):
            pending.append(label.group(1))
        elif inside and (found := _INSTRUCTION.match(line)):
            address, text = int(found.group(1), 16), found.group(2)
            guard = _GUARD.match(text)
            instructions.append(Instruction(address, guard and guard.group(1), text[guard.end() if guard else 0 :]))
            labels.update(dict.fromkeys(pending, address))
            pending.clear()
    while instructions and instructions[-1].opcode == "NOP":
        instructions.pop()
    return instructions, labels


def _jump_target(ins: Instruction, labels: dict[str, int]) -> int | None:
    """The address a BRA or JMP goes to (a label, or a literal address), None for other instructions."""
    if ins.opcode.split(".")[0] not in ("BRA", "JMP"):
        return None
    found = _TARGET.search(ins.text)
    if not found:
        return None
    return labels.get(found.group(1)) if found.group(1) else int(found.group(2), 16)


def _is_unconditional(ins: Instruction) -> bool:
    """No guard (or @PT) and, for a jump, no predicate or register operand beside the target (``BRA P1, `(..)``,
    ``BRA.DIV UR4, `(..)`` may fall through)."""
    if ins.guard not in (None, "@PT"):
        return False
    operands = _TARGET.sub("", ins.text.split(None, 1)[1]) if " " in ins.text else ""
    return not operands.strip(" ,")


def _successors(instructions: list[Instruction], labels: dict[str, int]) -> list[list[int]]:
    """The control-flow graph over instruction indices: the fall-through and the jump target of each."""
    index = {ins.address: i for i, ins in enumerate(instructions)}
    out: list[list[int]] = []
    for i, ins in enumerate(instructions):
        nexts = []
        target = _jump_target(ins, labels)
        if target in index:
            nexts.append(index[target])
        ends = ins.opcode.split(".")[0] in _NO_FALL_THROUGH and _is_unconditional(ins)
        if not ends and i + 1 < len(instructions):
            nexts.append(i + 1)
        out.append(nexts)
    return out


def _reachable(successors: list[list[int]], avoid: int | None = None) -> set[int]:
    """The instruction indices reachable from the entry (index 0) without passing ``avoid``."""
    if avoid == 0 or not successors:
        return set()
    seen, todo = {0}, deque([0])
    while todo:
        for nxt in successors[todo.popleft()]:
            if nxt != avoid and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def loops(sass_text: str, function: str = "flashtune_fwd") -> list[Loop]:
    """The loops of ``function``, as address ranges [header, last backward branch to it].

    A backward branch (a BRA or JMP whose target's address is not above its own) closes a loop only where its
    target dominates it: every path from the entry to the branch passes the target. nvcc puts an mbarrier wait's
    retry out of line after the last EXIT, as a spin loop and a ``BRA`` back to just after the wait: that branch
    is backward, and its range (the rest of the key-block loop, the epilogue, the other retries) holds HGMMA and
    MUFU.EX2, but it is no loop: the retry block is entered from before its target. Back edges to one header
    make one loop, to the furthest of them (a ``continue``'s branch does not end the loop)."""
    instructions, labels = function_sass(sass_text, function)
    successors = _successors(instructions, labels)
    reachable = _reachable(successors)
    ends: dict[int, int] = {}
    for i, ins in enumerate(instructions):
        target = _jump_target(ins, labels)
        if target is None or target > ins.address or i not in reachable:
            continue
        header = next(j for j, other in enumerate(instructions) if other.address == target)
        if i not in _reachable(successors, avoid=header):
            ends[header] = max(ends.get(header, i), i)
    found = []
    for header, last in sorted(ends.items()):
        body = instructions[header : last + 1]
        hgmma = sum(ins.opcode.startswith("HGMMA") for ins in body)
        mufu = sum(ins.opcode.startswith("MUFU.EX2") for ins in body)
        found.append(Loop(instructions[header].address, instructions[last].address, len(body), hgmma, mufu))
    return found


def key_block_loop(sass_text: str, function: str = "flashtune_fwd") -> Loop | None:
    """The key-block loop of ``function`` in ``nvdisasm -c`` output (:func:`loops` says what a loop is), or None.

    Candidates are the loops holding at least one HGMMA and one MUFU.EX2 (a block's GEMMs and its softmax); of
    them, the innermost: those whose range holds no other candidate's (the loop over work units holds the key-block
    loop; spin-wait loops nested inside it hold no HGMMA and do not count). Its instructions are every instruction
    line of the range [start, end], branches and the rescale's conditional code included; the out-of-line retries
    of its barrier waits (after the EXIT, run only while a wait misses) are not.

    Where several innermost candidates remain (a peeled or specialised copy of the loop, e.g. one per scheduler
    path), the one with the most instructions is reported, the first of those by address on a tie: the heaviest
    copy bounds what a key block costs, so comparing heaviest against heaviest cannot hide a knob's heavier hot
    loop behind a lighter copy that rarely runs. The sm90 builds checked here (the defaults at d64 and d128,
    poly_exp) have one.
    """
    candidates = [loop for loop in loops(sass_text, function) if loop.hgmma and loop.mufu]
    innermost = [
        loop
        for loop in candidates
        if not any(o != loop and loop.start <= o.start and o.end <= loop.end for o in candidates)
    ]
    return max(innermost, key=lambda loop: (loop.instructions, -loop.start), default=None)


# ---- builds --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Build:
    name: str
    head_dim: int
    config: dict
    sass: Path  # the nvdisasm output, kept in the session's temporary directory
    loop: Loop | None

    def expected_hgmma(self) -> int:
        """wgmma k-steps of one key block: head_dim / 16 of S = Q K^T, block_n / 16 of O += P V (one HGMMA each)."""
        return self.head_dim // 16 + self.config["block_n"] // 16

    def expected_mufu(self) -> int:
        """block_n / 2 exponentials per thread, poly_exp of every 8 of them off MUFU, plus the rescale's 2."""
        values = self.config["block_n"] // 2
        return values - values // 8 * self.config["poly_exp"] + 2


def assert_loop_within(build_a: Build, build_b: Build, rel: float) -> None:
    """``build_a``'s key-block loop does a block's work (the same HGMMA) in at most ``rel`` more instructions than
    ``build_b``'s (one-sided: fewer instructions pass)."""
    a, b = build_a.loop, build_b.loop
    assert a is not None and b is not None, f"no key-block loop: {build_a.name} {a}, {build_b.name} {b}"
    assert a.hgmma == b.hgmma, f"{build_a.name} {a} and {build_b.name} {b} do different GEMM work per iteration"
    assert a.instructions <= b.instructions * (1 + rel), (
        f"{build_a.name}'s key-block loop has {a.instructions} instructions, {a.instructions / b.instructions - 1:+.1%} "
        f"against {build_b.name}'s {b.instructions} (allowed {rel:+.1%}); SASS: {build_a.sass}, {build_b.sass}"
    )


def find_nvdisasm() -> str | None:
    """nvdisasm of PyPI's nvidia-cuda-nvdisasm in this environment, else one on PATH."""
    wheel = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / "nvdisasm"
    return str(wheel) if wheel.is_file() else shutil.which("nvdisasm")


@pytest.fixture(scope="session")
def sass_build(tmp_path_factory):
    """A function (name, head_dim, partial config) -> :class:`Build`: the partial completed at ``head_dim``
    (tests/kernels/sm90_configs.py's way), built for fp16 non-causal, disassembled and parsed once a session."""
    nvdisasm = find_nvdisasm()
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    if nvdisasm is None:
        pytest.skip("nvdisasm not found: pip install 'nvidia-cuda-nvdisasm>=13.0' (in flashtune's test extras)")
    space, device, out = load_space("sm90"), limits_for_arch(90), tmp_path_factory.mktemp("sass")
    built: dict[tuple[int, str], Build] = {}

    def build(name: str, head_dim: int, partial: dict) -> Build:
        key = (head_dim, repr(sorted(partial.items())))
        if key not in built:
            problem = _problem(head_dim, "fp16", False)
            config = complete(space, partial, problem, device).config
            kernel = compile_config(space, config, problem, device)
            text = subprocess.run(
                [nvdisasm, "-c", kernel.cubin_path], capture_output=True, text=True, check=True, timeout=300
            ).stdout
            sass = out / f"{name}-d{head_dim}.sass"
            sass.write_text(text)
            built[key] = Build(name, head_dim, config, sass, key_block_loop(text, kernel.entry))
        return built[key]

    return build


# ---- tests of the parser, on hand-written SASS ---------------------------------------------------------------------

#: a unit loop (0x0050-0x0200) around a key-block loop (0x0070-0x0170) with a spin-wait loop inside it, an
#: epilogue loop without HGMMA, a wait's out-of-line retry after the EXIT that branches back into the key-block
#: loop (backward, not a loop), the trap loop and NOP padding, then another function with a larger loop
SNIPPET = """
//--------------------- .text.flashtune_fwd       --------------------------
        .section        .text.flashtune_fwd,"ax",@progbits
flashtune_fwd:
.text.flashtune_fwd:
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0020*/               @P0 BRA `(.L_x_9) ;
        /*0030*/                   MOV R2, RZ ;
        /*0040*/                   MOV R3, RZ ;
.L_x_1:
        /*0050*/                   HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT ;
        /*0060*/                   MUFU.EX2 R4, R4 ;
.L_x_2:
        /*0070*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6], R5 ;
        /*0080*/              @!P0 BRA `(.L_x_7) ;
.L_x_4:
        /*0090*/                   HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT ;
        /*00a0*/                   HGMMA.64x64x16.F32 R88, R152, gdesc[UR8], R88 ;
.L_x_3:
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR7], R5 ;
        /*00c0*/              @!P1 BRA `(.L_x_3) ;
        /*00d0*/                   FFMA R4, R24, UR4, -R6 ;
        /*00e0*/                   MUFU.EX2 R4, R4 ;
        /*00f0*/                   MUFU.EX2 R5, R5 ;
        /*0100*/                   VOTE.ANY R7, PT, P2 ;
        /*0110*/               @P2 BRA `(.L_x_5) ;
        /*0120*/                   MUFU.EX2 R6, R6 ;
        /*0130*/                   FMUL R88, R88, R6 ;
.L_x_5:
        /*0140*/                   F2FP.F16.F32.PACK_AB R152, R5, R4 ;
        /*0150*/                   IADD3 R2, R2, -0x1, RZ ;
        /*0160*/                   ISETP.GE.AND P3, PT, R2, RZ, PT ;
        /*0170*/               @P3 BRA `(.L_x_2) ;
        /*0180*/                   HGMMA.64x64x16.F32 R88, R152, gdesc[UR8], R88 ;
.L_x_6:
        /*0190*/                   STS [R8], R88 ;
        /*01a0*/                   IADD3 R3, R3, 0x1, RZ ;
        /*01b0*/                   ISETP.NE.AND P4, PT, R3, 0x4, PT ;
        /*01c0*/               @P4 BRA `(.L_x_6) ;
        /*01d0*/                   IADD3 R9, R9, 0x1, RZ ;
        /*01e0*/                   ISETP.NE.AND P5, PT, R9, R10, PT ;
        /*01f0*/              @!P5 BRA `(.L_x_9) ;
        /*0200*/                   BRA `(.L_x_1) ;
.L_x_9:
        /*0210*/                   EXIT ;
.L_x_7:
        /*0220*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6], R5 ;
        /*0230*/              @!P0 BRA `(.L_x_7) ;
        /*0240*/                   BRA `(.L_x_4) ;
.L_x_8:
        /*0250*/                   BRA `(.L_x_8);
        /*0260*/                   NOP;
        /*0270*/                   NOP;
.L_x_10:


//--------------------- .text.other       --------------------------
        .section        .text.other,"ax",@progbits
other:
.text.other:
.L_x_11:
        /*0000*/                   HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT ;
        /*0010*/                   MUFU.EX2 R4, R4 ;
        /*0020*/                   NOP ;
        /*0030*/                   NOP ;
        /*0040*/                   NOP ;
        /*0050*/                   NOP ;
        /*0060*/                   NOP ;
        /*0070*/                   NOP ;
        /*0080*/                   NOP ;
        /*0090*/                   NOP ;
        /*00a0*/                   NOP ;
        /*00b0*/                   NOP ;
        /*00c0*/                   NOP ;
        /*00d0*/                   NOP ;
        /*00e0*/                   NOP ;
        /*00f0*/                   NOP ;
        /*0100*/                   NOP ;
        /*0110*/                   NOP ;
        /*0120*/               @P0 BRA `(.L_x_11) ;
        /*0130*/                   EXIT ;
"""


def test_loops_of_a_snippet_are_the_natural_ones():
    """The spin wait, the key-block loop, the epilogue loop, the unit loop, the retry's own spin; not the retry's
    branch back into the key-block loop (0x0240 -> 0x0090), nor the unreachable trap (0x0250)."""
    found = {(loop.start, loop.end) for loop in loops(SNIPPET)}
    assert found == {(0xB0, 0xC0), (0x70, 0x170), (0x190, 0x1C0), (0x50, 0x200), (0x220, 0x230)}
    instructions, labels = function_sass(SNIPPET)
    assert instructions[-1].address == 0x250 and labels[".L_x_4"] == 0x90  # the padding NOPs dropped


def test_key_block_loop_of_a_snippet():
    loop = key_block_loop(SNIPPET)
    assert loop == Loop(start=0x70, end=0x170, instructions=17, hgmma=2, mufu=3)
    assert key_block_loop(SNIPPET, "other") == Loop(0x0, 0x120, instructions=19, hgmma=1, mufu=1)
    assert key_block_loop(SNIPPET, "missing") is None


#: two innermost candidates (a peeled copy): the second heavier, with a second back edge (a ``continue``) to its header
PEELED = """
.text.flashtune_fwd:
        /*0000*/                   MOV R2, RZ ;
.L_x_1:
        /*0010*/                   HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT ;
        /*0020*/                   MUFU.EX2 R4, R4 ;
        /*0030*/                   IADD3 R2, R2, -0x1, RZ ;
        /*0040*/                   ISETP.GE.AND P3, PT, R2, RZ, PT ;
        /*0050*/               @P3 BRA `(.L_x_1) ;
        /*0060*/               @P0 EXIT ;
.L_x_2:
        /*0070*/                   HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT ;
        /*0080*/                   MUFU.EX2 R4, R4 ;
        /*0090*/                   MUFU.EX2 R5, R5 ;
        /*00a0*/               @P1 BRA `(.L_x_2) ;
        /*00b0*/                   IADD3 R2, R2, -0x1, RZ ;
        /*00c0*/                   ISETP.GE.AND P3, PT, R2, RZ, PT ;
        /*00d0*/               @P3 BRA `(.L_x_2) ;
        /*00e0*/                   EXIT ;
"""


def test_key_block_loop_takes_the_heaviest_of_two_copies():
    assert loops(PEELED) == [Loop(0x10, 0x50, 5, hgmma=1, mufu=1), Loop(0x70, 0xD0, 7, hgmma=1, mufu=2)]
    assert key_block_loop(PEELED) == Loop(0x70, 0xD0, 7, hgmma=1, mufu=2)


# ---- tests on sm90 builds ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [64, 128])
def test_default_key_block_loop_holds_one_blocks_gemms_and_exponentials(sass_build, head_dim):
    build = sass_build("default", head_dim, SM90_REPRESENTATIVE["default"])
    loop = build.loop
    assert loop is not None, f"no key-block loop in {build.sass}"
    assert loop.hgmma == build.expected_hgmma(), (loop, build.sass)
    assert loop.mufu == build.expected_mufu(), (loop, build.sass)
    assert loop.instructions > loop.hgmma + loop.mufu


def test_the_comparison_detects_a_heavier_loop(sass_build):
    """Polynomial exponentials (FT_POLY_EXP=2): fewer MUFU.EX2, more instructions, so the 2% bound fails."""
    default = sass_build("default", 64, SM90_REPRESENTATIVE["default"])
    poly = sass_build("poly_exp", 64, SM90_REPRESENTATIVE["poly_exp"])
    assert poly.config["poly_exp"] == 2 and poly.loop is not None
    assert poly.loop.hgmma == default.loop.hgmma
    assert poly.loop.mufu == poly.expected_mufu() < default.loop.mufu
    assert poly.loop.instructions > default.loop.instructions
    with pytest.raises(AssertionError, match="poly_exp's key-block loop has"):
        assert_loop_within(poly, default, 0.02)
    assert_loop_within(default, poly, 0.02)  # one-sided: the lighter loop passes


def exponentials_before_pv_wait(build: Build) -> int:
    """MUFU.EX2 of the key-block loop issued after its wait for S (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: S_j has
    landed, P_{j-1} V_{j-1} may still run) and before its wait for that P.V (``gsb0, 0x0``)."""
    instructions, _ = function_sass(build.sass.read_text())
    body = [ins.text for ins in instructions if build.loop.start <= ins.address <= build.loop.end]
    first = next(i for i, text in enumerate(body) if text.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1"))
    last = next(i for i in range(first, len(body)) if body[i].startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    return sum(text.startswith("MUFU.EX2") for text in body[first:last])


@pytest.mark.parametrize("overlap", [1, 2])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_exponentials_run_beside_the_warpgroups_own_pv_gemm(sass_build, head_dim, overlap):
    """intra_wg_overlap 2: a block's exponentials are issued while the previous block's P.V runs; 1: only the
    rescale's 2 are. With the wait for that P.V in the exponentials' basic block, ptxas put the wait first and only
    the rescale's 2 ran before it, whatever the source's order."""
    build = sass_build(f"overlap{overlap}", head_dim, {"intra_wg_overlap": overlap})
    assert build.loop is not None
    assert exponentials_before_pv_wait(build) == (build.expected_mufu() if overlap == 2 else 2), build.sass
