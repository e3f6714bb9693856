"""The worked example of a kernel directory of your own (examples/my_kernel, family my_fa), as its README walks
through it, without a GPU: ``flashtune check --kernels`` (real nvcc), a study tuned with the test doubles
(the GPU worker's fake handler, a stand-in compiler), then ``best``, ``export`` and ``report`` through the
command line with ``--kernels``; a study never resumes on changed sources, and a family the command cannot
find says where it came from."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_one_error_line, flashtune
from tests.conftest import REPO_ROOT
from tests.fakes.fake_gpu import FakeGpu
from tuner.problem import Problem
from tuner.run import RunSpec, TuneSettings, gpu_infos, prepare_study, run_on_gpus
from tuner.space import KERNELS_ENV, load_space
from tuner.study import KERNEL, StudyError

EXAMPLE = REPO_ROOT / "examples" / "my_kernel"
PROBLEM = Problem(batch=2, seqlen_q=512, heads_q=4, head_dim=64, dtype="bf16", causal=True)
_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@pytest.fixture
def kdir(tmp_path) -> Path:
    target = tmp_path / "my_kernel"
    shutil.copytree(EXAMPLE, target)
    return target


def _spec(kdir: Path, tmp_path: Path, n_trials: int = 6) -> RunSpec:
    return RunSpec(
        family="my_fa",
        problem=PROBLEM,
        storage_url=f"sqlite:///{tmp_path}/studies.db",
        study_name="mine",
        sampler="random",
        seed=1,
        settings=TuneSettings(n_trials=n_trials, compile_workers=1, compile_ahead=1),
        handler=FakeGpu,
        compiler="tests.fakes.standin_tuner:standin_compile",
    )


@_NVCC
@pytest.mark.parametrize("head_dim", [64, 128])
def test_check_compiles_the_example_spill_free(tmp_path, head_dim):
    proc = flashtune(
        "check", "--kernels", str(EXAMPLE), "--family", "my_fa", "--head-dim", str(head_dim), "--samples", "3",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"my_fa on sm_80 for fp16 d{head_dim}" in proc.stdout
    assert "check passed" in proc.stdout and "SPILLS" not in proc.stdout


def test_the_walkthrough_tune_best_export_report(kdir, tmp_path, monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, str(kdir))  # as `flashtune tune --kernels DIR` sets it for its processes
    spec = _spec(kdir, tmp_path)
    info = gpu_infos([0], handler=FakeGpu)[0]
    run = prepare_study(spec, info)
    assert run.space.root == kdir.resolve()
    assert run.study.user_attrs[KERNEL] == {"origin": str(kdir.resolve()), "source_digest": run.space.source_digest()}
    summary = run_on_gpus(run, [0], [info])
    assert summary is not None
    monkeypatch.delenv(KERNELS_ENV)
    storage = ("--storage", spec.storage_url)

    best = flashtune("best", "--kernels", str(kdir), "--study", "mine", *storage, "--json", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    config = json.loads(best.stdout)["config"]
    assert set(config) == {"block_m", "block_n", "threads_per_row"}

    header = tmp_path / "best.h"
    export = flashtune("export", "--kernels", str(kdir), "--study", "mine", *storage, "-o", str(header), cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    text = header.read_text()
    for knob in load_space("my_fa", kernels=kdir).knobs:
        assert re.search(rf"^#define {knob.macro} +{config[knob.name]} ", text, re.MULTILINE), knob
    assert f"nvcc -I {kdir.resolve()} -include <this header> {kdir.resolve()}/my_fa/flash_fwd.cu" in text
    assert "#define FT_HEAD_DIM 64" in text and "#define FT_IS_BF16 1" in text and "#define FT_IS_CAUSAL 1" in text

    report = flashtune("report", "--kernels", str(kdir), "--study", "mine", *storage, "-o", "r.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "my_fa" in (tmp_path / "r.html").read_text()


def test_a_study_never_resumes_on_changed_sources(kdir, tmp_path, monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, str(kdir))
    spec = _spec(kdir, tmp_path, n_trials=1)
    info = gpu_infos([0], handler=FakeGpu)[0]
    prepare_study(spec, info)
    prepare_study(spec, info)  # unchanged: resumes
    with (kdir / "my_fa" / "config.cuh").open("a") as f:
        f.write("// tweaked\n")
    with pytest.raises(StudyError, match=r"sources of kernel family my_fa changed since study 'mine'"):
        prepare_study(spec, info)
    proc = flashtune(
        "worker", "--kernels", str(kdir), "--study", "mine", "--storage", spec.storage_url, cwd=tmp_path
    )  # joining from another host is refused the same way
    assert_one_error_line(proc, "worker", "sources of kernel family my_fa changed")


def test_commands_that_cannot_find_the_family_say_where_it_came_from(kdir, tmp_path, monkeypatch):
    monkeypatch.setenv(KERNELS_ENV, str(kdir))
    spec = _spec(kdir, tmp_path, n_trials=1)
    prepare_study(spec, gpu_infos([0], handler=FakeGpu)[0])
    monkeypatch.delenv(KERNELS_ENV)
    proc = flashtune("export", "--study", "mine", "--storage", spec.storage_url, cwd=tmp_path)
    assert_one_error_line(proc, "export", "my_fa", f"kernel directory {kdir.resolve()}", "--kernels")


def test_a_kernels_option_that_is_no_directory_is_one_error_line(tmp_path):
    proc = flashtune("check", "--kernels", str(tmp_path / "nope"), "--family", "my_fa", cwd=tmp_path)
    assert_one_error_line(proc, "check", "is not a directory")
    proc = flashtune("check", "--family", "my_fa", cwd=tmp_path)
    assert_one_error_line(proc, "check", "unknown kernel family 'my_fa'", "--kernels DIR")


def test_every_command_that_names_a_family_or_a_study_takes_kernels():
    from tuner.cli._parser import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, command in commands.items():
        dests = {a.dest for a in command._actions}
        if dests & {"family", "study"}:
            assert "kernels" in dests, name
    assert {"check", "tune", "best", "export", "report", "worker", "bench"} <= {
        n for n, c in commands.items() if "kernels" in {a.dest for a in c._actions}
    }
