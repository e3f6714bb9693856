"""tuner.bench_suite: a suite's winners against the peers in one run, the Markdown table, ablations
(the real study storage and worker process; a stand-in GPU handler and compiler)."""

from __future__ import annotations

import dataclasses
import io
import os

import pytest

from tests.fakes.fake_gpu import FakeGpu
from tests.fakes.standin_tuner import PROBLEM, standin_compile, standin_tflops
from tuner.bench import bench_suite, markdown_table
from tuner.gpu import GEMM_PEER, PEER_NAMES
from tuner.run import RunSpec, TuneSettings, Worker, gpu_infos, prepare_study, run_on_gpus
from tuner.space import load_space
from tuner.study import load_suite

HANDLER = FakeGpu


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A storage holding one finished stand-in study of PROBLEM, and a suite naming it and one more problem."""
    tmp = tmp_path_factory.mktemp("bench")
    url = f"sqlite:///{tmp}/s.db"
    spec = RunSpec(
        family="sm80",
        problem=PROBLEM,
        storage_url=url,
        sampler="random",
        seed=1,
        settings=TuneSettings(n_trials=8, compile_workers=1, compile_ahead=1),
        handler=HANDLER,
        compiler="tests.fakes.standin_tuner:standin_compile",
    )
    info = gpu_infos([0], handler=HANDLER)[0]
    run_on_gpus(prepare_study(spec, info), [0], [info])
    suite_path = tmp / "two.toml"
    suite_path.write_text(f'''family = "sm80"
storage = "{url}"
[grid]
head_dim = 128
heads = {PROBLEM.heads_q}
batch = {PROBLEM.batch}
seqlen = [{PROBLEM.seqlen_q}, 4096]
''')
    return load_suite(suite_path), url, info


def test_each_problem_gets_its_winner_and_the_peers_of_the_same_run(tuned):
    suite, url, info = tuned
    log = io.StringIO()
    with Worker(handler=HANDLER) as worker:
        rows = bench_suite(worker, info, suite, url, log=log, compiler=standin_compile)
    assert [r.problem for r in rows] == list(suite.problems)
    done, missing = rows
    assert done.study and done.tflops == pytest.approx(standin_tflops(done.config))
    assert done.peers["sdpa_cudnn_attention"] == 150.0 and done.ratio("cudnn") == pytest.approx(done.tflops / 150)
    assert missing.tflops is None and "no study of this problem" in missing.note and not missing.peers
    assert "bench [1/2]" in log.getvalue() and "x cuDNN" in log.getvalue()

    table = markdown_table(rows, info, suite, url)
    assert "| dtype | D | heads | causal | N |" in table and "Stand-in GPU" in table
    assert f"| fp16 | 128 | {PROBLEM.heads_q} | no | {PROBLEM.seqlen_q} |" in table
    assert f"{done.tflops / 150:.3f}" in table and f"{done.tflops / 300:.3f}" in table
    assert "cuBLAS GEMM 8192³ 300–300 TFLOPS" in table


def test_the_problems_default_config_is_timed_beside_its_winner(tuned):
    """The table's default column is the config a user gets untuned: the space's defaults for the problem."""
    suite, url, info = tuned
    with Worker(handler=HANDLER) as worker:
        done = bench_suite(worker, info, suite, url, compiler=standin_compile)[0]
    default = load_space("sm80").defaults(problem=done.problem)
    assert done.default_tflops == pytest.approx(standin_tflops(default))
    assert done.default_ratio("cudnn") == pytest.approx(done.default_tflops / 150)
    assert "| default | default vs cuDNN |" in markdown_table([done], info, suite, url)
    assert f"| {done.default_tflops:.1f} | {done.default_tflops / 150:.3f} |" in markdown_table(
        [done], info, suite, url
    )


def test_ablation_times_each_tuned_knob_at_its_default(tuned):
    suite, url, info = tuned
    with Worker(handler=HANDLER) as worker:
        row = bench_suite(worker, info, suite, url, ablate=True, compiler=standin_compile)[0]
    defaults = load_space("sm80").defaults()
    changed = {k for k, v in row.config.items() if v != defaults[k]}
    assert set(row.ablations) == changed and changed
    for knob, tflops in row.ablations.items():
        if tflops is not None:  # None: the config with this knob at its default is infeasible
            assert tflops == pytest.approx(standin_tflops({**row.config, knob: defaults[knob]}))
    assert "Ablations:" in markdown_table([row], info, suite, url)


def test_cli_refuses_suite_with_study_or_config_and_ablate_without_suite(tmp_path, capsys):
    from tuner.cli import main

    assert main(["bench", "--ablate"]) == 2
    assert "--ablate, --output and --rounds go with --suite" in capsys.readouterr().err
    assert main(["bench", "--rounds", "2"]) == 2
    assert "--ablate, --output and --rounds go with --suite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--rounds", "0"])
    assert "expected 1 to 100 rounds, not 0" in capsys.readouterr().err
    suite = tmp_path / "s.toml"
    suite.write_text('family = "sm80"\n[grid]\nhead_dim = 128\nheads = 2\nbatch = 1\nseqlen = 128\n')
    assert main(["bench", "--suite", str(suite), "--config", "block_m=64"]) == 2
    assert "drop --study/--config" in capsys.readouterr().err


def test_compiling_up_front_in_a_pool_gives_the_same_rows(tuned, tmp_path, monkeypatch):
    """With compile_workers > 1 every kernel of the run (winners and ablations) is built in a process pool first,
    so the timing loop only reads the cache: each is compiled once, in the pool."""
    suite, url, info = tuned
    log = tmp_path / "compiled.log"
    monkeypatch.setenv("FLASHTUNE_STANDIN_COMPILE_LOG", str(log))
    with Worker(handler=HANDLER) as worker:
        serial = bench_suite(worker, info, suite, url, ablate=True, compiler=standin_compile)
        log.unlink()
        pooled = bench_suite(worker, info, suite, url, ablate=True, compiler=standin_compile, compile_workers=2)
    assert [(r.config, r.tflops, r.ablations) for r in pooled] == [(r.config, r.tflops, r.ablations) for r in serial]
    in_pool = [pid for pid in log.read_text().split() if int(pid) != os.getpid()]
    winner_and_default = 1 if pooled[0].default_tflops == pooled[0].tflops else 2
    assert len(in_pool) == winner_and_default + sum(t is not None for t in pooled[0].ablations.values())


class _Drifting:
    """The worker, recording the order of its calls (a peer by its name) and scaling every figure by the round's
    drift (a GPU whose clock moves during the run): the i-th call of a round of ``per_round`` calls scales by
    DRIFT[round % 3], whichever kernel it times."""

    DRIFT = (1.0, 0.8, 1.1)

    def __init__(self, worker, per_round: int) -> None:
        self.worker = worker
        self.per_round = per_round
        self.calls: list[str] = []

    def _scale(self) -> float:
        return self.DRIFT[(len(self.calls) - 1) // self.per_round % 3]

    def measure(self, job, **kwargs):
        self.calls.append(job.tag)
        result = self.worker.measure(job, **kwargs)
        return dataclasses.replace(result, tflops=result.tflops * self._scale())

    def peers(self, problem, settings, names=None, **kwargs):
        rows = self.worker.peers(problem, settings, names, **kwargs)
        out = []
        for p in rows:
            self.calls.append(p["name"])
            out.append({**p, "tflops": p["tflops"] * self._scale() if p.get("tflops") else None})
        return out


SDPA = [name for name in PEER_NAMES if name != GEMM_PEER]


def test_rounds_interleave_ours_the_default_and_the_peers_and_keep_each_ones_median(tuned):
    """Each round times the winner, the default (where it differs) and the SDPA peers, round r starting r places
    along that list; each figure is the median over the rounds, so a drift during the run moves ours and the peers'
    alike and leaves the ratio. The GEMM comes once, after the rounds (the card's clocks drop after it)."""
    suite, url, info = tuned
    default = load_space("sm80").defaults(problem=suite.problems[0])
    with Worker(handler=HANDLER) as worker:
        once = bench_suite(worker, info, suite, url, compiler=standin_compile, rounds=1)[0]
        steps = ["bench-suite", *(["default"] if default != once.config else []), *SDPA]
        drifting = _Drifting(worker, per_round=len(steps))
        row = bench_suite(drifting, info, suite, url, compiler=standin_compile, rounds=3)[0]
    rotated = [
        step
        for r in range(3)
        for step in (["bench-suite", "default", *SDPA][r:] + ["bench-suite", "default", *SDPA][:r])
    ]
    expected = [step for step in rotated if step in steps] + [GEMM_PEER]
    assert drifting.calls[: len(expected)] == expected
    assert drifting.calls[len(expected) - 1] == GEMM_PEER and drifting.calls.count(GEMM_PEER) == 1
    assert row.rounds == 3 and once.rounds == 1
    assert row.tflops == pytest.approx(once.tflops)  # median of (1.0, 0.8, 1.1) x its figure
    assert row.peers["sdpa_cudnn_attention"] == pytest.approx(150.0)
    assert row.ratio("cudnn") == pytest.approx(once.ratio("cudnn"))
    assert row.peers["sdpa_efficient_attention"] is None  # refused in every round
    assert row.peers[GEMM_PEER] == pytest.approx(300.0 * _Drifting.DRIFT[0])  # timed once, in a fourth "round"
    assert "each figure the median of 3 interleaved rounds" in markdown_table([row], info, suite, url)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        bench_suite(worker, info, suite, url, compiler=standin_compile, rounds=0)
