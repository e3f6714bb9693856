"""``flashtune export``: the best-config header from a (fake) finished study, checked values only, and nvcc."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import UTC, datetime

import optuna
import pytest

from tests.fake_studies import A100_INFO, family_for_tests, fill_study, make_study, open_fake_study
from tuner._version import __version__
from tuner.cli import main
from tuner.devices import limits_for_arch
from tuner.export import comment_text, read_header, render_header
from tuner.paths import KERNEL_SRC
from tuner.problem import Problem
from tuner.space import available_families, load_space
from tuner.study import StudyError, choose
from tuner.study import _meta as st

NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
PROBLEM = Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128, dtype="bf16", causal=True)
DEFINE = re.compile(r"^#define (\w+)(?: (.*?))?(?:\s+//.*)?$")


def defines(text: str) -> dict[str, str]:
    return {m.group(1): (m.group(2) or "").strip() for line in text.splitlines() if (m := DEFINE.match(line))}


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('export')}/studies.db"


@pytest.fixture(scope="module")
def finished(storage_url):
    """A study with a re-timed winner, and one without (best trial only)."""
    family = family_for_tests()
    retimed = make_study(storage_url, "retimed", family, PROBLEM, n_trials=24, seed=1)
    plain = make_study(storage_url, "plain", family, PROBLEM, n_trials=24, seed=2, winner=False)
    return retimed, plain


def test_header_defines_every_macro_of_the_chosen_config(finished, storage_url):
    study, _ = finished
    chosen = choose(study)
    space = load_space(study.user_attrs["family"])
    text = render_header(chosen, storage_url=storage_url, now=NOW)
    found = defines(text)
    guard = "FLASHTUNE_RETIMED_H"
    lines = text.splitlines()
    assert lines.index(f"#ifndef {guard}") + 1 == lines.index(f"#define {guard}")
    assert lines[-1] == f"#endif  // {guard}"
    assert found.pop(guard) == ""
    assert found.pop("FLASHTUNE_FAMILY") == f'"{space.name}"'
    assert {k: int(v) for k, v in found.items()} == space.macros(chosen.config, PROBLEM, chosen.device)
    assert found["FT_HEAD_DIM"] == "128" and found["FT_IS_BF16"] == "1" and found["FT_IS_CAUSAL"] == "1"
    assert chosen.config == study.user_attrs["winner"]["config"]
    assert chosen.source == "retimed" and chosen.trial == study.user_attrs["winner"]["trial"]


def test_comment_block_describes_the_result(finished, storage_url):
    study, _ = finished
    chosen = choose(study)
    text = render_header(chosen, storage_url=storage_url, now=NOW)
    winner = study.user_attrs["winner"]
    for needle in (
        f"kernel family  {chosen.family}",
        "arch           sm_90",
        "GPU            NVIDIA H200",
        "dtype          bf16",
        "head dim       128",
        "causal         yes",
        "batch 4, seqlen_q 2048, seqlen_k 2048, heads_q 16, heads_kv 16",
        f"{winner['tflops']:.1f} TFLOPS (re-timed winner, trial {winner['trial']})",
        f"{winner['speedup_over_default']:.3f}x the default config",
        "2025-03-04T05:06:07+00:00",
        f"flashtune {__version__}",
        storage_url,
    ):
        assert needle in text, needle
    geometry = chosen.space.launch(chosen.config, chosen.problem, chosen.device)
    assert (
        f"{geometry.grid} for this shape on {chosen.device.num_sms} SMs; {geometry.threads} threads; "
        f"{geometry.smem_bytes} B of dynamic shared memory"
    ) in text
    assert chosen.space.launch_grid[0].text in text  # the rule, for other shapes
    for line in text.splitlines():  # everything but the guard, the defines and blank lines is a // comment
        assert line == "" or line.startswith(("//", "#")), line


def test_a_dynamic_scheduler_config_says_the_kernel_needs_a_tile_counter(storage_url):
    """sm90 with scheduler=1 takes a tile counter (ABI sm90_tma_sched): the header says so; with 0 it does not."""
    import dataclasses

    chosen = choose(make_study(storage_url, "sm90-scheduler", "sm90", PROBLEM, n_trials=4, seed=3))
    note = "tile_counter, 8 zeroed bytes per stream"
    static = dataclasses.replace(chosen, config={**chosen.config, "scheduler": 0})
    dynamic = dataclasses.replace(chosen, config={**chosen.config, "scheduler": 1, "persistent": 1, "cta_mode": 1})
    assert note not in render_header(static, storage_url=storage_url, now=NOW)
    assert note in render_header(dynamic, storage_url=storage_url, now=NOW)


def test_a_split_kv_config_says_what_workspace_the_kernel_needs(storage_url, tmp_path):
    """sm90 with kv_splits > 1 takes split-KV's counters and partials: the header gives their sizes for the study's
    shape and the rules for others; with neither split-KV nor the tail split it says nothing of them."""
    import dataclasses

    chosen = choose(make_study(storage_url, "sm90-split", "sm90", PROBLEM, n_trials=4, seed=3))
    plain = dataclasses.replace(chosen, config={**chosen.config, "kv_splits": 1, "tail_splits": 1})
    split = dataclasses.replace(chosen, config={**chosen.config, "kv_splits": 2})
    assert "split_counters" not in render_header(plain, storage_url=storage_url, now=NOW)
    text = render_header(split, storage_url=storage_url, now=NOW)
    abi = split.space.launch(split.config, split.problem, split.device).abi
    assert f"pass split_counters, {abi['split_counter_bytes']} B zeroed" in text
    assert f"split_partials, {abi['split_partial_bytes']} B" in text
    assert "bytes = 4 * units * cta_mode * consumer_wgs if kv_splits > 1 else " in text
    assert "bytes = 4 * units * cta_mode * kv_splits * block_m * (head_dim + 4) if kv_splits > 1 else " in text
    path = tmp_path / "split.h"
    path.write_text(text)
    assert read_header(path, split.space) == split.config  # the rows are comments: the config reads back
    # the tail split takes the same workspace, sized by the GPU (the rules name num_sms, not the shape)
    tail = dataclasses.replace(chosen, config={**chosen.config, "kv_splits": 1, "tail_splits": 3, "persistent": 1})
    text = render_header(tail, storage_url=storage_url, now=NOW)
    abi = tail.space.launch(tail.config, tail.problem, tail.device).abi
    assert abi["split_counter_bytes"] and f"pass split_counters, {abi['split_counter_bytes']} B zeroed" in text
    assert "4 * (num_sms * ctas_per_sm // cta_mode // 2) * cta_mode * consumer_wgs if tail_splits > 1" in text
    assert re.search(r"#define FT_TAIL_SPLITS +3 ", text)
    path.write_text(text)
    assert read_header(path, tail.space) == tail.config


def test_best_trial_is_used_without_a_retimed_winner(finished, storage_url):
    _, study = finished
    chosen = choose(study)
    best = max(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)), key=lambda t: t.value)
    assert chosen.source == "best trial" and chosen.config == best.params and chosen.trial == best.number
    default = st.default_trial(study)
    assert chosen.speedup_over_default == pytest.approx(best.value / default.value)
    assert "best measured trial" in render_header(chosen, storage_url=storage_url, now=NOW)


def test_password_in_the_storage_url_is_masked(finished):
    study, _ = finished
    text = render_header(choose(study), storage_url="postgresql+psycopg://tuner:s3cret@db.example/ft", now=NOW)
    assert "s3cret" not in text
    assert "postgresql+psycopg://tuner:***@db.example/ft" in text


def test_header_round_trips_through_read_header(finished, storage_url, tmp_path):
    study, _ = finished
    chosen = choose(study)
    path = tmp_path / "best.h"
    path.write_text(render_header(chosen, storage_url=storage_url, now=NOW))
    assert read_header(path, chosen.space) == chosen.config
    other = [f for f in available_families() if f != chosen.family]
    if other:
        with pytest.raises(StudyError, match="is a config of family"):
            read_header(path, load_space(other[0]))


def test_tuner_attention_takes_an_exported_header_as_config(finished, storage_url, tmp_path):
    """``tuner.attention(config=...)``: None, a partial dict or a header path, resolved without a GPU."""
    import sys

    from tuner.serve import AttentionError, resolve_config

    probe = "import sys, tuner; assert callable(tuner.attention); assert 'cupy' not in sys.modules, 'cupy imported'"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr  # importing tuner needs no GPU: CuPy is imported on the first call
    study, _ = finished
    chosen = choose(study)
    path = tmp_path / "best.h"
    path.write_text(render_header(chosen, storage_url=storage_url, now=NOW))
    space = chosen.space
    assert resolve_config(space, path) == resolve_config(space, str(path)) == chosen.config
    assert resolve_config(space, None) == space.defaults()
    first = space.knobs[0]
    partial = {first.name: first.values[-1]}
    assert resolve_config(space, partial) == dict(space.defaults(), **partial)
    sm90, where = load_space("sm90"), {"problem": Problem(batch=1, seqlen_q=128, heads_q=1, head_dim=128)}
    where["device"] = limits_for_arch(90)  # with a problem and a device: completed as tuner.attention does
    assert resolve_config(sm90, {"persistent": 0}, **where) == {**sm90.defaults(128), "persistent": 0, "scheduler": 0}
    with pytest.raises(AttentionError, match="q_stages_persistent"):
        resolve_config(sm90, {"persistent": 0, "q_stages": 1}, **where)
    with pytest.raises(AttentionError):
        resolve_config(space, 42)
    with pytest.raises(StudyError, match="cannot read"):
        resolve_config(space, tmp_path / "absent.h")


def test_free_text_from_the_database_cannot_leave_its_comment(storage_url):
    space = load_space(family_for_tests())
    evil = "x\n#define FT_BLOCK_M 1 \\\n*/ ??/"
    gpu = dict(A100_INFO, name=f"NVIDIA H200{evil}")
    study = open_fake_study(storage_url, f"evil{evil}", space, PROBLEM, gpu=gpu)
    fill_study(study, space, PROBLEM, n_trials=8, failures=False)
    text = render_header(choose(study), storage_url=storage_url, now=NOW)
    assert "\\" not in text and "??" not in text
    names = list(defines(text))
    assert len(names) == len(set(names)), "a macro is defined twice"
    assert set(names) - {"FLASHTUNE_FAMILY"} - {
        n for n in names if n.startswith("FLASHTUNE_") and n.endswith("_H")
    } == set(space.macros(choose(study).config, PROBLEM, choose(study).device))
    assert comment_text("a\nb\r\x00c\\ ???/") == "a?b?c/ ?/"


def _mutated(storage_url: str, name: str, **attrs) -> optuna.Study:
    study = make_study(storage_url, name, family_for_tests(), PROBLEM, n_trials=8, failures=False)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


def test_stale_space_digest_is_refused(storage_url):
    study = _mutated(storage_url, "stale", space_digest="0123456789abcdef")
    with pytest.raises(StudyError, match="re-tune with a new study"):
        choose(study)


@pytest.mark.parametrize(
    "bad",
    [{"block_m": 999}, {"block_m": "128\n#include <evil.h>"}, {"nonsense": 1}, {}],
    ids=["value-not-allowed", "text", "unknown-knob", "missing-knob"],
)
def test_stored_values_that_do_not_fit_the_space_are_refused(storage_url, bad, request):
    study = make_study(storage_url, request.node.name, family_for_tests(), PROBLEM, n_trials=8, failures=False)
    space = load_space(study.user_attrs["family"])
    winner = dict(study.user_attrs["winner"])
    knob = space.knobs[0].name
    config = dict(winner["config"])
    if "block_m" in bad:
        config[knob] = bad["block_m"]
    elif bad:
        config.update(bad)
    else:
        config.pop(knob)
    study.set_user_attr("winner", dict(winner, config=config))
    with pytest.raises(StudyError, match="no longer fits"):
        choose(study)


@pytest.mark.parametrize(
    "attrs, match",
    [
        ({"winner": "garbage"}, "malformed winner"),
        ({"winner": {"config": [128, 64], "tflops": 1.0}}, "malformed best config"),
        ({"problem": {"batch": 1}}, "malformed problem"),
        ({"problem": dict(PROBLEM.to_dict(), causal="yes")}, "malformed problem"),
        ({"gpu": {"name": "x"}}, "malformed GPU"),
        ({"family": "../../etc"}, "no valid kernel family"),
    ],
    ids=["winner", "config", "problem", "causal", "gpu", "family"],
)
def test_malformed_study_attributes_are_refused(storage_url, attrs, match, request):
    study = _mutated(storage_url, request.node.name, **attrs)
    with pytest.raises(StudyError, match=match):
        choose(study)


def test_infeasible_winner_is_refused(storage_url):
    study = make_study(storage_url, "infeasible-winner", family_for_tests(), PROBLEM, n_trials=8, failures=False)
    space = load_space(study.user_attrs["family"])
    device = choose(study).device
    infeasible = None
    for config in _all_configs(space):
        if space.check(config, PROBLEM, device):
            infeasible = config
            break
    assert infeasible is not None
    study.set_user_attr("winner", dict(study.user_attrs["winner"], config=infeasible))
    with pytest.raises(StudyError, match="infeasible"):
        choose(study)


def _all_configs(space):
    import itertools

    for values in itertools.product(*(k.values for k in space.knobs)):
        yield dict(zip((k.name for k in space.knobs), values))


def test_study_without_a_successful_trial_is_refused(storage_url):
    space = load_space(family_for_tests())
    study = open_fake_study(storage_url, "empty", space, PROBLEM)
    with pytest.raises(StudyError, match="no successful trial"):
        choose(study)


# -- nvcc ---------------------------------------------------------------------------------------
def _nvcc_arch(space) -> str:
    arch = space.arch_string(space.family.min_arch)
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("family", available_families())
def test_kernel_builds_with_the_header_in_place_of_flags(family, storage_url, tmp_path):
    """The cubin built with ``-include header`` is the one built with the same ``-D`` flags (sm_80; sm_90a)."""
    space = load_space(family)
    study = make_study(storage_url, f"nvcc-{family}", family, PROBLEM, n_trials=16, seed=3, failures=False)
    chosen = choose(study)
    header = tmp_path / "best.h"
    header.write_text(render_header(chosen, storage_url=storage_url, now=NOW))
    base = [
        "nvcc",
        "-cubin",
        "-std=c++17",
        "-O3",
        _nvcc_arch(space),
        "-I",
        str(KERNEL_SRC),
        str(KERNEL_SRC / space.family.source),
    ]
    with_header = subprocess.run(
        [*base, "-include", str(header), "-o", str(tmp_path / "header.cubin")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert with_header.returncode == 0, with_header.stderr[-3000:]
    flags = [f"-D{k}={v}" for k, v in chosen.macros.items()]
    with_flags = subprocess.run(
        [*base, *flags, "-o", str(tmp_path / "flags.cubin")], capture_output=True, text=True, timeout=600
    )
    assert with_flags.returncode == 0, with_flags.stderr[-3000:]
    assert (tmp_path / "header.cubin").read_bytes() == (tmp_path / "flags.cubin").read_bytes()


# -- command line --------------------------------------------------------------------------------
def test_cli_writes_the_header(finished, storage_url, tmp_path, capsys):
    out = tmp_path / "best.h"
    assert main(["export", "--study", "retimed", "--storage", storage_url, "-o", str(out)]) == 0
    assert "#define FT_HEAD_DIM 128" in out.read_text()
    assert main(["export", "--study", "retimed", "--storage", storage_url]) == 0
    assert "#define FT_HEAD_DIM 128" in capsys.readouterr().out


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("flashtune export: error: "), err
    return err[0]


def test_cli_unknown_study(finished, storage_url, capsys):
    assert main(["export", "--study", "no-such-study", "--storage", storage_url]) == 2
    assert "no study named 'no-such-study'" in _error(capsys)


def test_cli_stale_space(storage_url, capsys):
    _mutated(storage_url, "stale-cli", space_digest="feedfacefeedface")
    capsys.readouterr()
    assert main(["export", "--study", "stale-cli", "--storage", storage_url]) == 2
    assert "re-tune" in _error(capsys)


@pytest.mark.parametrize("where", ["missing-folder/best.h", "."])
def test_cli_bad_output_path(finished, storage_url, tmp_path, capsys, where):
    assert main(["export", "--study", "retimed", "--storage", storage_url, "-o", str(tmp_path / where)]) == 2
    assert "cannot write" in _error(capsys)


def test_cli_password_never_printed(tmp_path, capsys):
    url = "postgresql+psycopg://tuner:s3cret@127.0.0.1:1/none"
    assert main(["export", "--study", "x", "--storage", url]) == 2
    assert "s3cret" not in capsys.readouterr().err
