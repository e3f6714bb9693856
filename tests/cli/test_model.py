"""``flashtune tune --model config.json``: a Hugging Face model's attention shapes written as a suite and
tuned as one; its studies exported with ``export --dispatch --suite`` serve ``config="auto", tuned=``."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import HAS_GPU, assert_one_error_line, flashtune
from tests.fake_studies import family_for_tests, make_study
from tuner.problem import Problem
from tuner.serve import load_tuned
from tuner.space import load_space
from tuner.study import choose, load_suite, open_storage

LLAMA = {
    "_name_or_path": "tiny/llama-gqa",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "torch_dtype": "float16",
}


def _config(tmp_path, config=LLAMA):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _tune_model(tmp_path, *extra):
    url = f"sqlite:///{tmp_path}/model.db"
    args = ("tune", "--model", str(_config(tmp_path)), "--seqlens", "1024,4096", "--batch", "1")
    return flashtune(*args, "--family", family_for_tests(), "--storage", url, *extra, cwd=tmp_path), url


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: tune would run")
def test_tune_model_writes_the_model_s_suite_and_tunes_it(tmp_path):
    proc, url = _tune_model(tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    first, last = proc.stderr.strip().splitlines()
    assert first.startswith("suite llama-gqa-attention.toml: 2 attention shapes of tiny/llama-gqa")
    assert last.startswith("flashtune tune: error: no usable GPU 0")  # the suite's first study needs one
    suite = load_suite(tmp_path / "llama-gqa-attention.toml")
    assert suite.family == family_for_tests() and suite.storage == url
    assert suite.problems == tuple(
        Problem(batch=1, seqlen_q=n, heads_q=16, heads_kv=4, head_dim=128, dtype="fp16", causal=True)
        for n in (1024, 4096)
    )
    before = (tmp_path / "llama-gqa-attention.toml").stat()
    again, _ = _tune_model(tmp_path)  # rerunning resumes the same suite file, unchanged
    assert again.stderr.splitlines()[0] == first
    after = (tmp_path / "llama-gqa-attention.toml").stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)


def test_a_model_s_suite_exports_as_tuned_configs(tmp_path):
    family = family_for_tests()
    url = f"sqlite:///{tmp_path}/model.db"
    proc = flashtune(
        "tune", "--model", str(_config(tmp_path)), "--seqlens", "1024,4096", "--batch", "1", "--family", family,
        "--storage", url, "--model-suite", "llama.toml", "--gpus", "99", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0 and (tmp_path / "llama.toml").exists()  # no GPU 99: the suite is written, no study
    suite = load_suite(tmp_path / "llama.toml")
    winners = {}
    for i, problem in enumerate(suite.problems):  # what tune --suite would have stored, on a fake H200
        winners[problem] = choose(make_study(url, f"m{i}", family, problem, n_trials=8, seed=i)).config
    exported = flashtune("export", "--dispatch", "--suite", "llama.toml", "-o", "dispatch.h", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    tuned = load_tuned(tmp_path / "dispatch.json")
    space = load_space(family)
    for problem, config in winners.items():
        assert tuned.lookup(space, problem) == (config, None)
    assert len(open_storage(url).get_all_studies()) == 2


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (("--heads", "8"), "--heads: the model config gives these"),
        (("--head-dim", "64"), "--head-dim"),
        (("--suite", "x.toml"), "give one of --model and --suite"),
        (("--study", "mine"), "--study names one study"),
        (("--seqlens", "1024,x"), "expected lengths such as 1024,4096"),
    ],
)
def test_tune_model_refuses_what_contradicts_it(tmp_path, extra, fragment):
    proc, _ = _tune_model(tmp_path, *extra)
    assert_one_error_line(proc, "tune", fragment)
    assert not list(tmp_path.glob("*.toml")) and not (tmp_path / "model.db").exists()


def test_tune_model_never_replaces_another_file(tmp_path):
    (tmp_path / "llama-gqa-attention.toml").write_text("# mine\n")
    proc, _ = _tune_model(tmp_path)
    assert_one_error_line(proc, "tune", "exists and is not this model's suite", "--model-suite")
    assert (tmp_path / "llama-gqa-attention.toml").read_text() == "# mine\n"


def test_tune_model_refuses_a_config_it_cannot_read_in_one_line(tmp_path):
    _config(tmp_path, {"model_type": "x", "vision_config": {"patch_size": 14}})
    proc = flashtune("tune", "--model", "config.json", cwd=tmp_path)
    assert_one_error_line(proc, "tune", "names no attention heads", "vision_config")
