"""``config="auto"``: the tuned config per shape at run time (tuner/tuned.py) chooses as the dispatch header does.

Fake finished studies (tests/fake_studies.py) are exported with ``flashtune export --dispatch``;
the header's ``select()`` is compiled on the host (g++, or nvcc) and asked for every bucket
edge; the JSON written beside it, and the same studies read straight from their storage (a
suite file, a storage URL), must give the same config for every query.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fake_studies import family_for_tests, make_study
from tuner.cli import main
from tuner.export import JSON_FORMAT
from tuner.problem import DTYPES, Problem
from tuner.serve import TunedConfigs, TunedError, load_tuned, parse_tuned_json, tuned_configs
from tuner.space import available_families, load_space

FAMILY = family_for_tests()
OTHER = next((f for f in available_families() if f != FAMILY), None)
SEQLENS = (512, 2048, 4096)


def problem(dtype: str, causal: bool, seqlen: int, head_dim: int = 128) -> Problem:
    return Problem(batch=16384 // seqlen, seqlen_q=seqlen, heads_q=16, head_dim=head_dim, dtype=dtype, causal=causal)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """FAMILY: fp16 x causal or not x SEQLENS, bf16 non-causal at 2048 only; OTHER (if any): one fp16 study.
    Returns (storage URL, suite file, folder)."""
    folder = tmp_path_factory.mktemp("tuned")
    url = f"sqlite:///{folder}/studies.db"
    shapes = [("fp16", c, n) for c in (False, True) for n in SEQLENS] + [("bf16", False, 2048)]
    for i, (dtype, causal, n) in enumerate(shapes):
        p = problem(dtype, causal, n)
        make_study(url, f"auto-{FAMILY}-{p.slug()}", FAMILY, p, n_trials=10, seed=i, failures=False)
    if OTHER:
        p = problem("fp16", False, 2048)
        make_study(url, f"auto-{OTHER}-{p.slug()}", OTHER, p, n_trials=10, seed=50, failures=False)
    suite = folder / "suite.toml"
    suite.write_text(
        f'family = "{FAMILY}"\nstorage = "{url}"\n\n[grid]\ndtype = ["fp16", "bf16"]\n'
        f"causal = [false, true]\nhead_dim = 128\nheads = 16\nseqlen = [512, 2048, 4096]\n"
        "tokens = 16384\n"
    )
    return url, suite, folder


@pytest.fixture(scope="module")
def exported(storage):
    """(dispatch.h, dispatch.json) written by `flashtune export --dispatch -o`."""
    url, _, folder = storage
    out = folder / "dispatch.h"
    assert main(["export", "--dispatch", "--study", "auto-*", "--storage", url, "-o", str(out)]) == 0
    assert out.with_suffix(".json").is_file()
    return out, out.with_suffix(".json")


def queries(tuned: TunedConfigs) -> list[tuple[str, str, int, bool, int]]:
    """(family, dtype, head_dim, causal, seqlen): every bucket edge of every entry, and every (dtype, head dim,
    causal) of each family, covered or not, at 1 and past the largest tuned length."""
    out = []
    for name, table in sorted(tuned.tables.items()):
        head_dims = sorted(set(load_space(name).family.head_dims) | {e[1] for e in table.entries})
        for dtype in sorted(DTYPES):
            for head_dim in head_dims:
                for causal in (False, True):
                    edges = {1, 1 << 30}
                    edges |= {n + d for e in table.entries for n in (e[3],) for d in (-1, 0, 1)}
                    out += [(name, dtype, head_dim, causal, n) for n in sorted(edges)]
    return out


def compiled_select(header: Path, tuned: TunedConfigs, asked, folder: Path) -> list[dict[str, int]]:
    """What the header's select() returns for each query, from a host program that includes it."""
    compiler = shutil.which("g++") or shutil.which("c++")
    command = [compiler, "-std=c++17", "-O0"] if compiler else None
    if command is None and shutil.which("nvcc"):
        command = ["nvcc", "-std=c++17", "-x", "cu"]
    if command is None:
        pytest.skip("no C++ compiler (g++ or nvcc)")
    lines = [f'#include "{header.name}"', "#include <cstdio>", "using flashtune::DType;", "int main() {"]
    for family, dtype, head_dim, causal, seqlen in asked:
        knobs = tuned.tables[family].knobs
        lines.append(
            f"  {{ auto c = flashtune::{family}::select(DType::{dtype}, {head_dim}, {str(causal).lower()}, "
            f'{seqlen}); std::printf("'
            + " ".join(["%d"] * len(knobs))
            + '\\n", '
            + ", ".join(f"c.{k}" for k in knobs)
            + "); }"
        )
    lines += ["  return 0;", "}", ""]
    source = folder / "select_probe.cpp"
    source.write_text("\n".join(lines))
    build = subprocess.run(
        [*command, "-I", str(header.parent), str(source), "-o", str(folder / "select_probe")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(folder / "select_probe")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return [
        dict(zip(tuned.tables[q[0]].knobs, map(int, line.split())))
        for q, line in zip(asked, run.stdout.splitlines(), strict=True)
    ]


def python_select(tuned: TunedConfigs, query) -> dict[str, int]:
    family, dtype, head_dim, causal, seqlen = query
    return tuned.tables[family].select(dtype, head_dim, causal, seqlen)


def test_json_storage_and_suite_choose_as_the_compiled_header_on_every_bucket_edge(storage, exported, tmp_path):
    url, suite, _ = storage
    header, json_path = exported
    from_json = load_tuned(json_path)
    asked = queries(from_json)
    assert len(asked) > 100
    expected = compiled_select(header, from_json, asked, tmp_path)
    assert [python_select(from_json, q) for q in asked] == expected
    from_url = load_tuned(url, pattern="auto-*")
    assert [python_select(from_url, q) for q in asked] == expected
    from_suite = load_tuned(suite)  # the suite names FAMILY only: the other family is not in its tables
    own = [(q, e) for q, e in zip(asked, expected) if q[0] == FAMILY]
    assert [python_select(from_suite, q) for q, _ in own] == [e for _, e in own]
    assert "fp16-d128-full-b8-h16-n2048" not in from_suite.not_covered
    assert any("bf16-d128-causal" in n for n in from_suite.not_covered)


def test_config_for_falls_back_to_the_family_default(exported):
    tuned = load_tuned(exported[1])
    space = load_space(FAMILY)
    uncovered = problem("bf16", True, 2048)  # no bf16 causal study
    assert tuned.config_for(space, uncovered) == space.defaults(128)
    for d in space.family.head_dims:
        p = Problem(batch=1, seqlen_q=100, heads_q=2, head_dim=d, dtype="fp16")
        if d != 128:
            assert tuned.config_for(space, p) == space.defaults(d)
    empty = TunedConfigs(tables={}, source="nothing")
    assert empty.config_for(space, uncovered) == space.defaults(128)


def test_the_json_holds_the_header_tables(exported):
    header, json_path = exported
    data = json.loads(json_path.read_text())
    assert data["format"] == JSON_FORMAT and data["gpu"] == "NVIDIA H200"
    family = next(f for f in data["families"] if f["family"] == FAMILY)
    assert family["knobs"] == [k.name for k in load_space(FAMILY).knobs]
    assert len(family["entries"]) == 7
    text = header.read_text()
    for entry in family["entries"]:  # each entry's config literal appears in the header's kEntries
        literal = "{" + ", ".join(str(entry["config"][k]) for k in family["knobs"]) + "}"
        causal = "true" if entry["causal"] else "false"
        assert f"{{DType::{entry['dtype']}, {entry['head_dim']}, {causal}, {entry['seqlen']}, {literal}}}" in text


def test_export_refuses_a_json_name_for_the_header(storage, tmp_path, capsys):
    url, _, _ = storage
    assert main(["export", "--dispatch", "--study", "auto-*", "--storage", url, "-o", str(tmp_path / "d.json")]) == 2
    assert "its JSON is written beside it" in capsys.readouterr().err
    assert not (tmp_path / "d.json").exists()


# -- the cache follows the files ----------------------------------------------------------------------
def test_an_edited_json_is_read_again(exported, tmp_path):
    copy = tmp_path / "d.json"
    text = exported[1].read_text()
    copy.write_text(text)
    first = tuned_configs(copy)
    assert tuned_configs(str(copy)) is first  # unchanged: the same object (a launch-cache key)
    data = json.loads(text)
    table = next(f for f in data["families"] if f["family"] == FAMILY)
    table["entries"] = table["entries"][:1]
    copy.write_text(json.dumps(data))
    second = tuned_configs(copy)
    assert second is not first and len(second.tables[FAMILY].entries) == 1


def test_a_sqlite_storage_is_read_again_when_it_changes(storage):
    url, _, _folder = storage
    first = tuned_configs(url)
    assert tuned_configs(url) is first
    p = problem("bf16", True, 4096)
    make_study(url, f"auto-{FAMILY}-{p.slug()}", FAMILY, p, n_trials=6, seed=77, failures=False)
    second = tuned_configs(url)
    assert second is not first
    assert any(e[:4] == ("bf16", 128, True, 4096) for e in second.tables[FAMILY].entries)


# -- bad JSON ------------------------------------------------------------------------------------------
def test_malformed_json_gets_one_line(exported, tmp_path):
    good = json.loads(exported[1].read_text())

    def variant(change) -> str:
        data = json.loads(json.dumps(good))
        change(data)
        return json.dumps(data)

    def first(data):
        return next(f for f in data["families"] if f["family"] == FAMILY)

    cases = [
        ("{", "not a dispatch JSON"),
        ("[]", "format"),
        (json.dumps({**good, "format": "other"}), "format"),
        (exported[1].read_text().replace('"seqlen": 512', '"seqlen": NaN', 1), "not valid JSON: NaN"),
        (variant(lambda d: first(d)["entries"][0].update(seqlen=True)), "seqlen must be an integer"),
        (variant(lambda d: first(d)["entries"][0].update(seqlen=-4)), "seqlen must be an integer"),
        (variant(lambda d: first(d)["entries"][0].update(dtype="fp8")), "dtype must be one of"),
        (variant(lambda d: first(d)["entries"].reverse()), "must be sorted"),
        (variant(lambda d: first(d)["entries"][0]["config"].pop(first(d)["knobs"][0])), "must give the knobs"),
        (variant(lambda d: first(d).update(extra=1)), "exactly family, knobs"),
        (variant(lambda d: d["families"].append(first(d))), "appears twice"),
        (
            variant(lambda d: first(d)["entries"][0]["config"].update({first(d)["knobs"][0]: 10**30})),
            "must be an integer",
        ),
    ]
    for text, message in cases:
        with pytest.raises(TunedError, match=message) as e:
            parse_tuned_json(text, "d.json")
        assert "\n" not in str(e.value)
    with pytest.raises(TunedError, match="not a dispatch JSON"):
        parse_tuned_json(b"\xff\xfe\x00binary", "d.json")
    path = tmp_path / "binary.json"
    path.write_bytes(os.urandom(256))
    with pytest.raises(TunedError, match=r"binary.json"):
        load_tuned(path)
    with pytest.raises(TunedError, match="cannot read"):
        load_tuned(tmp_path / "absent.json")


def test_json_that_no_longer_fits_the_space_is_refused(exported):
    good = json.loads(exported[1].read_text())
    space = load_space(FAMILY)
    renamed = json.loads(json.dumps(good))
    table = next(f for f in renamed["families"] if f["family"] == FAMILY)
    old = table["knobs"][0]
    table["knobs"][0] = "renamed"
    for config in [table["default"]] + [e["config"] for e in table["entries"]]:
        config["renamed"] = config.pop(old)
        config.update({k: config.pop(k) for k in table["knobs"][1:]})  # keep the knob order
    tuned = parse_tuned_json(json.dumps(renamed), "d.json")
    with pytest.raises(TunedError, match=r"knobs .* today's space file has"):
        tuned.config_for(space, problem("fp16", False, 512))
    bad_value = json.loads(json.dumps(good))
    table = next(f for f in bad_value["families"] if f["family"] == FAMILY)
    table["entries"][0]["config"][space.knobs[0].name] = 12345
    tuned = parse_tuned_json(json.dumps(bad_value), "d.json")
    entry = table["entries"][0]
    with pytest.raises(TunedError, match=r"no longer fits the space.*not one of"):
        tuned.config_for(space, problem(entry["dtype"], entry["causal"], entry["seqlen"]))


def test_tuned_sources_that_are_not_one(tmp_path):
    for source, message in (
        ("x.txt", "give the .json"),
        (f"sqlite:///{tmp_path}/none.db", "no study database"),
        (tmp_path / "absent.toml", "cannot read"),
    ):
        with pytest.raises(TunedError, match=message):
            tuned_configs(source)


# -- tuner.attention(config="auto") ----------------------------------------------------------------------
def test_attention_auto_launches_the_selected_config_per_shape(exported, monkeypatch):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    pytest.importorskip("cupy", reason="tuner.gpu needs CuPy installed (not a GPU)")
    import tuner
    from tests.fakes.standin_launch import H200, StandInGPU, install

    gpu = StandInGPU(device=H200)  # the GPU the studies were measured on (tests/fake_studies.py)
    install(monkeypatch, gpu)
    tuned = load_tuned(exported[1])
    space = load_space(FAMILY)
    for dtype, causal, seqlen in (
        ("fp16", False, 511),
        ("fp16", False, 512),
        ("fp16", False, 513),
        ("fp16", True, 4097),
        ("bf16", False, 100),
        ("bf16", True, 2048),
    ):
        torch_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
        q, k, v = (torch.zeros(1, seqlen, 2, 128, dtype=torch_dtype) for _ in range(3))
        for source in (exported[1], str(exported[1]), tuned):
            tuner.attention(q, k, v, causal=causal, family=FAMILY, config="auto", tuned=source)
        wanted = tuned.tables[FAMILY].select(dtype, 128, causal, seqlen)
        p = Problem(batch=1, seqlen_q=seqlen, heads_q=2, head_dim=128, dtype=dtype, causal=causal)
        assert gpu.loaded[-1]["config"] == wanted == tuned.config_for(space, p)
