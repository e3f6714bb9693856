"""The CPU side of the device benchmark tests/gpu/bench_sm90.py: its plan, its orchestration of the
GPU worker (here a fake handler, FakeSm90: no GPU, no nvcc), the table and the ncu command."""

from __future__ import annotations

import itertools
import json
import os
import time

import pytest

from tests.gpu import bench_sm90 as bench
from tuner.devices import limits_for_arch
from tuner.problem import Problem
from tuner.space import load_space


def test_a_deadline_that_leaves_no_time_to_compile_is_refused_with_the_one_to_give(tmp_path, capsys):
    suite = bench.REPO / "studies" / "models_h200.toml"  # 12 shapes: about 136 s kept for their timing
    with pytest.raises(SystemExit) as stop:
        bench.main(["--out", str(tmp_path), "--suite", str(suite), "--deadline", "100", "--no-ncu"])
    assert stop.value.code == 2
    assert "--deadline 100 leaves no time to compile" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before any work


def test_every_shape_gets_a_feasible_plan_with_both_ctas_per_sm_values():
    space, device = load_space("sm90"), limits_for_arch(90)
    assert len(bench.SHAPES) == 10 and all(s in bench.SHAPES for s in bench.NCU_SHAPES + bench.QUICK_SHAPES)
    for shape in bench.SHAPES:
        problem = bench.make_problem(shape)
        configs, skipped = bench.plan_shape(space, device, problem, quick=False)
        assert configs[0]["name"] == "default" and configs[0]["diff"] == {}
        assert all(space.check(c["config"], problem, device) is None for c in configs)
        assert not [s for s in skipped if s["status"] == "invalid"], skipped  # every variant names real values
        assert len({json.dumps(c["config"], sort_keys=True) for c in configs}) == len(configs)
        assert {c["config"]["ctas_per_sm"] for c in configs} == {1, 2}, problem.slug()
        assert {c["config"]["persistent"] for c in configs} == {0, 1}
        assert len(configs) >= 12, problem.slug()
        if problem.head_dim == 64:  # 3 warpgroups are the d64 default; with one CTA per block too
            assert {"poly2", "wgs3_serial_bn160"} <= {c["name"] for c in configs}
            assert {(c["config"]["consumer_wgs"], c["config"]["persistent"]) for c in configs} >= {(3, 0), (3, 1)}


def test_the_plan_marks_the_problems_default_once():
    """The [[defaults]] rules' config is timed beside the head dim's default: the variant that is it carries the
    mark (split2 at a few-unit d128 shape), else a row of its own (when --variants leaves split2 out)."""
    space, device = load_space("sm90"), limits_for_arch(90)
    few = Problem(batch=1, seqlen_q=2048, heads_q=4, head_dim=128)  # causal, the unit_order rule would apply too
    configs, _ = bench.plan_shape(space, device, few, quick=False)
    marked = [c for c in configs if c.get("rules")]
    assert len(marked) == 1 and marked[0]["config"] == space.defaults(problem=few, device=device)
    assert marked[0]["config"]["kv_splits"] == 2 and marked[0]["name"] == "split2"
    bench._ONLY.update({"split3"})
    try:
        configs, _ = bench.plan_shape(space, device, few, quick=False)
    finally:
        bench._ONLY.clear()
    assert [c["name"] for c in configs] == ["default", "rules", "split3"]
    assert configs[1]["rules"] and configs[1]["diff"] == {"kv_splits": 2}


def test_rules_variants_move_one_knob_of_the_problems_default():
    """rules_kv2 is the problem's default (its rules applied) with two K/V stages; left out where that is the
    problem's default already (d128's)."""
    space, device = load_space("sm90"), limits_for_arch(90)
    bench._ONLY.update({"rules_kv2"})
    try:
        for problem in (
            Problem(batch=1, seqlen_q=2048, heads_q=4, head_dim=64, causal=True),  # split-KV's rule
            Problem(batch=2, seqlen_q=4096, heads_q=10, head_dim=64, dtype="bf16"),  # the tail split's
            Problem(batch=64, seqlen_q=197, heads_q=12, head_dim=64),  # 2 warpgroups
        ):
            rules = space.defaults(problem=problem, device=device)
            assert rules != space.defaults(problem.head_dim) and rules["kv_stages"] == 3, problem.slug()
            configs, _ = bench.plan_shape(space, device, problem, quick=False)
            moved = {c["name"]: c["config"] for c in configs}["rules_kv2"]
            assert moved == {**rules, "kv_stages": 2}
        problem = Problem(batch=2, seqlen_q=8192, heads_q=16, head_dim=128)
        configs, skipped = bench.plan_shape(space, device, problem, quick=False)
    finally:
        bench._ONLY.clear()
    assert [c["name"] for c in configs] == ["default"] and not skipped  # d128's default has two stages


def test_a_baseline_tree_times_the_problems_default_built_from_it(tmp_path, capsys):
    """--baseline DIR: each shape's default once more, built from DIR's kernel sources (a build of its own)."""
    space, device = load_space("sm90"), limits_for_arch(90)
    problem = bench.make_problem(bench.SHAPES[0])
    bench._BASELINE.append(str(tmp_path))
    try:
        configs, _ = bench.plan_shape(space, device, problem, quick=True)
    finally:
        bench._BASELINE.clear()
    baseline = configs[-1]
    assert baseline["name"] == "baseline" and baseline["root"] == str(tmp_path)
    assert baseline["config"] == space.defaults(problem=problem, device=device)
    default = next(c for c in configs if c.get("rules"))
    assert bench.build_key(problem, baseline) != bench.build_key(problem, default)
    default["tflops"], baseline["tflops"] = 100.0, 90.0  # the table names the row, also among the top rows
    plan = {"slug": problem.slug(), "configs": [default, baseline]}
    assert "(default) [baseline]" in bench.table([plan], None, top=0).splitlines()[-1]

    # the build reads DIR's sources: a tree whose entry fails to preprocess fails to build
    import shutil

    shutil.copytree(bench.REPO / "kernel_src", tmp_path / "kernel_src")
    entry = tmp_path / "kernel_src" / "sm90" / "flash_fwd.cu"
    entry.write_text("#error this is the baseline tree\n" + entry.read_text())
    arg = (baseline["config"], problem.to_dict(), device.to_dict(), str(tmp_path / "kernel_src"))
    result = bench._compile_one(arg)
    assert not result["ok"] and "nvcc failed" in result["detail"], result  # the tree in the package builds

    with pytest.raises(SystemExit) as stop:
        bench.main(["--out", str(tmp_path / "out"), "--baseline", str(tmp_path), "--no-ncu"])
    assert stop.value.code == 2 and "no sm90/flash_fwd.cu there" in capsys.readouterr().err


def test_the_served_variant_times_the_shipped_tables_winner_where_it_is_not_the_default(monkeypatch):
    """served_h200: the config the H200 table serves the problem, timed beside its default; absent where the
    table serves the default (every bucket of today's table, whose entries are all kept defaults)."""
    import dataclasses

    import tuner.serve

    space, device = load_space("sm90"), limits_for_arch(90)
    problem = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128, causal=True)
    default = space.defaults(problem=problem, device=device)
    bench._ONLY.update({bench.SERVED})
    try:
        configs, _ = bench.plan_shape(space, device, problem, quick=False)
        assert bench.SERVED not in {c["name"] for c in configs}
        winner = {**default, "pingpong": 1 - default["pingpong"]}
        assert space.check(winner, problem, device) is None
        shipped = tuner.serve.shipped_tuned("NVIDIA H200")
        table = dataclasses.replace(
            shipped.tables["sm90"], entries=(("fp16", 128, True, 4096, winner),), kept_defaults=frozenset()
        )
        monkeypatch.setattr(
            tuner.serve, "shipped_tuned", lambda gpu: dataclasses.replace(shipped, tables={"sm90": table})
        )
        configs, _ = bench.plan_shape(space, device, problem, quick=False)
    finally:
        bench._ONLY.clear()
    served = [c for c in configs if c["name"] == bench.SERVED]
    assert len(served) == 1 and served[0]["config"] == winner and served[0]["diff"]["pingpong"] == winner["pingpong"]


@pytest.mark.parametrize("count", [3, 4, 6])
def test_the_timing_order_puts_no_runner_always_behind_the_same_one(count):
    names = [f"r{i}" for i in range(count)]
    orders = [bench.round_order(names, r) for r in range(bench.ROUNDS)]
    assert all(sorted(order) == names for order in orders)  # every runner once a round
    behind: dict[str, set[str]] = {n: set() for n in names}  # the runners each one was timed right after
    for order in orders:
        for before, name in itertools.pairwise(order):
            behind[name].add(before)
    assert all(len(before) >= 2 for before in behind.values()), behind
    assert len({order[0] for order in orders}) >= 2  # not always the same runner first


@pytest.mark.parametrize("count", [2, 3, 4, 6])
def test_interleaved_launches_put_no_runner_always_behind_the_same_one(count):
    names = [f"r{i}" for i in range(count)]
    orders = [bench.launch_order(names, i) for i in range(5)]  # a round's fewest launches per runner
    assert all(sorted(order) == names for order in orders)  # every runner once per launch
    assert orders == [bench.launch_order(names, i) for i in range(5)]  # the same in every run
    launches = [name for order in orders for name in order]
    behind: dict[str, set[str]] = {n: set() for n in names}  # the runners each one was launched right after
    for before, name in itertools.pairwise(launches):
        behind[name].add(before)
    assert all(len(before) >= min(2, count - 1) for before in behind.values()), behind


def test_quick_plan_is_small():
    space, device = load_space("sm90"), limits_for_arch(90)
    for shape in bench.QUICK_SHAPES:
        configs, _ = bench.plan_shape(space, device, bench.make_problem(shape), quick=True)
        assert 2 <= len(configs) <= 4 + any(c.get("rules") and c["name"] == "rules" for c in configs)  # its own row


# ---- a fake GPU handler (the worker process makes one) --------------------------------------
class FakeSm90(bench.Sm90Bench):
    def setup(self, device):
        self.runners = set()

    def is_fatal(self, exc):
        return False

    def device_info(self):
        return {
            "name": "Fake H200",
            "arch": 90,
            "num_sms": 132,
            "smem_per_block_optin": 232448,
            "smem_per_sm": 233472,
            "regs_per_sm": 65536,
            "cupy": "0",
            "driver": "0",
            "torch": "0",
            "cudnn": 0,
        }

    def setup_shape(self, arg):
        self.runners = set()
        return {"reference_s": 0.0, "rows_checked": 1}

    def add_kernel(self, arg):
        if arg["name"] == "ctas2" and arg["check"]:
            time.sleep(30)  # a hang: the parent's timeout kills this worker
        if arg["name"] == "pingpong" and arg["check"]:
            os._exit(3)  # a crash: the parent must set the shape up again in a new worker and go on
        if arg["name"] == "one_per_block" and arg["check"]:
            return {"failure": "O relative error 1 > 0.002", "rel_error": 1.0, "lse_error": 0.0}
        self.runners.add(arg["name"])
        return {
            "failure": None,
            "rel_error": 1e-4,
            "lse_error": 1e-6,
            "ctas_per_sm_occupancy": arg["config"]["ctas_per_sm"],
        }

    def add_peers(self):
        self.runners |= {"sdpa_cudnn"}
        return {"sdpa_cudnn": {"failure": None, "rel_error": 1e-4}, "sdpa_flash": {"failure": "RuntimeError: no"}}

    def time_round(self, names):
        return {
            n: {"ms": 1.0 if n == "sdpa_cudnn" else 0.5 + 0.1 * len(n) / 10, "min_ms": 0.4, "reps": 5}
            for n in names
            if n in self.runners
        }

    def time_gemm(self):
        return {"round_ms": [1.0] * 3, "ms": 1.0, "tflops": 1099.5}


def test_orchestration_reports_wrong_and_crashed_configs_and_times_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "HANDLER", FakeSm90)
    monkeypatch.setattr(bench, "CHECK_TIMEOUT_S", 2.0)

    def fake_compile_all(plans, device, budget_s):
        for plan in plans:
            for e in plan["configs"]:
                e["build"] = (
                    {"ok": False, "detail": "CompileError: planted"}
                    if e["name"] == "ctas2" and plan["problem"].head_dim == 64
                    else {
                        "ok": True,
                        "cubin": "x.cubin",
                        "entry": "flashtune_fwd",
                        "compile_s": 0,
                        "cached": True,
                        "resources": {
                            "registers": 168,
                            "spill_store_bytes": 0,
                            "spill_load_bytes": 0,
                            "stack_bytes": 0,
                            "static_smem_bytes": 0,
                        },
                    }
                )

    monkeypatch.setattr(bench, "compile_all", fake_compile_all)
    assert bench.main(["--out", str(tmp_path), "--quick", "--no-ncu"]) == 0
    data = json.loads((tmp_path / "bench_sm90.json").read_text())
    assert len(data["shapes"]) == 2 and data["gemm"]["tflops"] > 1000
    for shape in data["shapes"]:
        status = {c["name"]: c["status"] for c in shape["configs"]}
        assert status["one_per_block"] == "wrong" and status["pingpong"] in ("crash", "skipped")
        assert status["default"] == "ok"
        timed = [c for c in shape["configs"] if c["status"] == "ok"]
        assert timed and all(len(c["round_ms"]) == bench.ROUNDS and c["tflops"] > 0 for c in timed)
        assert "round_ms" not in next(c for c in shape["configs"] if c["status"] == "wrong")
        assert shape["peers"]["sdpa_cudnn"]["round_ms"] and shape["peers"]["sdpa_flash"]["failure"]
    first, second = ({c["name"]: c for c in s["configs"]} for s in data["shapes"])
    assert first["pingpong"]["status"] == "crash" and first["ctas2"]["status"] == "hang"
    assert second["pingpong"]["status"] == "skipped" and "pp=1" in second["pingpong"]["detail"]
    assert second["ctas2"]["status"] == "compile_error"
    table = (tmp_path / "bench_sm90_table.txt").read_text()
    out = capsys.readouterr().out
    assert out.rstrip().endswith(table.rstrip().splitlines()[-1])  # the table is printed last
    assert "WRONG" in table and "compile_error" in table and "CRASH" in table and "cuBLAS GEMM" in table
    default_row = next(line for line in table.splitlines() if "(default)" in line and "d128" in line)
    assert " 1.000 " in default_row  # ratio to the default


def test_ncu_command_and_key_lines():
    cmd = bench.ncu_command("/usr/bin/ncu", "/tmp/spec.json", ["m.avg.pct_of_peak_sustained_active"], launches=9)
    text = " ".join(cmd)
    assert "--clock-control none" in text and "--target-processes all" in text and "--launch-count 9" in text
    assert "--profile-from-start off" in text and "--metrics m.avg.pct_of_peak_sustained_active" in text
    assert all(f"--section {s}" in text for s in ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats"))
    assert cmd[-4:] == ["-m", "tests.gpu.bench_sm90", "--ncu-run", "/tmp/spec.json"]
    assert "SourceCounters" not in text and "--export" not in text
    sourced = " ".join(bench.ncu_command("/usr/bin/ncu", "/tmp/spec.json", [], launches=3, report="/tmp/r"))
    assert "--section SourceCounters" in sourced and "--export /tmp/r " in sourced
    assert sourced.endswith("-m tests.gpu.bench_sm90 --ncu-run /tmp/spec.json")
    sample = (
        "NCU-SUBJECT flashtune:default\n  flashtune_fwd (132, 1, 1)x(384, 1, 1)\n    Duration  us  98.5\n"
        "    Some Other Metric  1\n    Achieved Occupancy   %   18.7\n"
    )
    assert bench.key_lines(sample) == [
        "NCU-SUBJECT flashtune:default",
        "  flashtune_fwd (132, 1, 1)x(384, 1, 1)",
        "    Duration  us  98.5",
        "    Achieved Occupancy   %   18.7",
    ]


def test_the_module_needs_no_optuna():
    """The script runs where optuna/sqlalchemy are not installed: it and the compile and GPU modules it
    imports must not need them (the tuning loop, tuner.run, stores trials through Optuna and does)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['optuna'] = None; sys.modules['sqlalchemy'] = None\n"
        "import tests.gpu.bench_sm90, tuner.compile, tuner.gpu, tuner.gpu._measure, tuner.gpu._launch, "
        "tuner.gpu._reference, tuner.gpu._tensors, tuner.gpu._info\n"
    )
    pytest.importorskip("cupy")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=bench.REPO)
    assert run.returncode == 0, run.stderr
