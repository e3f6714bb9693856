"""``flashtune export --dispatch``: one C++17 header over many (fake) studies, compiled and run by nvcc."""

from __future__ import annotations

import shutil
import subprocess
from datetime import UTC, datetime

import pytest

from tests.fake_studies import A100_INFO, family_for_tests, fill_study, make_study, open_fake_study, set_winner
from tuner.cli import main
from tuner.export import DispatchError, build_dispatch, render_dispatch
from tuner.problem import Problem
from tuner.space import available_families, load_space
from tuner.study import choose

NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
FAMILY = family_for_tests()
OTHER = next((f for f in available_families() if f != FAMILY), None)
SEQLENS = (512, 4096)


def problem(dtype: str, causal: bool, seqlen: int, head_dim: int = 128) -> Problem:
    return Problem(batch=16384 // seqlen, seqlen_q=seqlen, heads_q=16, head_dim=head_dim, dtype=dtype, causal=causal)


def study_name(family: str, p: Problem) -> str:
    return f"disp-{family}-{p.slug()}"


@pytest.fixture(scope="module")
def storage_url(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('dispatch')}/studies.db"


@pytest.fixture(scope="module")
def studies(storage_url):
    """FAMILY: fp16/bf16 x causal or not x SEQLENS; the other family (if any): one fp16 study."""
    out = []
    for i, (dtype, causal, n) in enumerate((d, c, n) for d in ("fp16", "bf16") for c in (False, True) for n in SEQLENS):
        p = problem(dtype, causal, n)
        out.append(make_study(storage_url, study_name(FAMILY, p), FAMILY, p, n_trials=8, seed=i, failures=False))
    if OTHER:
        p = problem("fp16", False, 2048)
        out.append(make_study(storage_url, study_name(OTHER, p), OTHER, p, n_trials=8, seed=99, failures=False))
    return out


@pytest.fixture(scope="module")
def families(studies):
    return build_dispatch([choose(s) for s in studies])


def test_entries_are_grouped_by_family_and_sorted(families, studies):
    assert [f.space.name for f in families] == sorted({FAMILY} | ({OTHER} if OTHER else set()))
    main_family = next(f for f in families if f.space.name == FAMILY)
    keys = [e.key for e in main_family.entries]
    assert keys == sorted(keys) and len(keys) == 8
    assert {e.chosen.study_name for f in families for e in f.entries} == {s.study_name for s in studies}


def test_two_studies_for_one_bucket_are_refused(studies, storage_url):
    p = studies[0].user_attrs["problem"]
    twin = Problem(**dict(p, batch=p["batch"] * 2))  # same (dtype, head_dim, causal, seqlen), other batch
    other = make_study(storage_url, "disp-twin", FAMILY, twin, n_trials=6, failures=False)
    with pytest.raises(DispatchError, match="both tune"):
        build_dispatch([choose(studies[0]), choose(other)])


def test_studies_of_different_gpus_are_refused(studies, storage_url):
    space = load_space(FAMILY)
    p = problem("fp16", False, 1024)
    other = open_fake_study(storage_url, "disp-a100", space, p, gpu=A100_INFO)
    fill_study(other, space, p, n_trials=6, failures=False)
    set_winner(other, space, p)
    with pytest.raises(DispatchError, match="different GPUs"):
        build_dispatch([choose(studies[0]), choose(other)])


def expected_select(entries, default, dtype, head_dim, causal, seqlen):
    """The documented rule, in Python: smallest tuned seqlen >= seqlen, else the largest, else the default."""
    same = sorted(
        (e for e in entries if (e.dtype, e.head_dim, e.causal) == (dtype, head_dim, causal)), key=lambda e: e.seqlen
    )
    for e in same:
        if seqlen <= e.seqlen:
            return e.chosen.config
    return same[-1].chosen.config if same else default


def translation_unit(families) -> tuple[str, list[dict[str, int]]]:
    """A .cu file that includes the header, instantiates a kernel template per config, static_asserts the
    selection of every entry and prints select() for a set of queries; and the configs it should print."""
    lines = [
        '#include "dispatch.h"',
        "#include <cstdio>",
        "using flashtune::DType;",
        "",
        "template <int... Knobs> __global__ void probe_kernel(int* out) {",
        "  constexpr int values[] = {Knobs...};",
        "  for (int i = 0; i < static_cast<int>(sizeof...(Knobs)); ++i) out[i] = values[i];",
        "}",
        "",
    ]
    queries, expected = [], []
    for n, fam in enumerate(families):
        ns, knobs = f"flashtune::{fam.space.name}", [k.name for k in fam.space.knobs]
        lines += [
            f"template <int I> struct Instantiate{n} {{",
            f"  static constexpr {ns}::Entry e = {ns}::kEntries[I];",
            f"  static_assert({ns}::select(e.dtype, e.head_dim, e.causal, e.seqlen) == e.config,",
            '                "an entry must select its own config");',
            "  static constexpr void (*kernel)(int*) = &probe_kernel<"
            + ", ".join(f"e.config.{k}" for k in knobs)
            + ">;",
            "};",
        ]
        lines += [f"template struct Instantiate{n}<{i}>;" for i in range(len(fam.entries))]
        lines.append(f'static_assert({ns}::kNumEntries == {len(fam.entries)}, "entry count");')
        statics = {(e.dtype, e.head_dim, e.causal) for e in fam.entries}
        # only head dim 128 is covered: the others fall back to their head dim's default
        statics |= {
            (d, h, c) for h in fam.space.family.head_dims if h != 128 for d, c in (("bf16", True), ("fp16", False))
        }
        for dtype, head_dim, causal in sorted(statics):
            for seqlen in (1, 511, 512, 513, 2048, 4096, 4097, 1 << 20):
                queries.append(
                    f"  {{ auto c = {ns}::select(DType::{dtype}, {head_dim}, {str(causal).lower()}, "
                    f'{seqlen}); std::printf("'
                    + " ".join(["%d"] * len(knobs))
                    + '\\n", '
                    + ", ".join(f"c.{k}" for k in knobs)
                    + "); }"
                )
                expected.append(
                    expected_select(fam.entries, fam.space.defaults(head_dim), dtype, head_dim, causal, seqlen)
                )
        lines.append(
            f'static_assert({ns}::select(DType::fp16, 64, false, 1000) == {ns}::default_config(64), "fallback");'
        )
        lines.append(f'static_assert({ns}::default_config(1000) == {ns}::kDefault, "the plain default");')
    lines += ["", "int main() {", *queries, "  return 0;", "}", ""]
    return "\n".join(lines), expected


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_header_compiles_instantiates_every_config_and_selects_by_the_documented_rule(families, storage_url, tmp_path):
    (tmp_path / "dispatch.h").write_text(render_dispatch(families, storage_url=storage_url, now=NOW))
    source, expected = translation_unit(families)
    (tmp_path / "probe.cu").write_text(source)
    build = subprocess.run(
        [
            "nvcc",
            "-std=c++17",
            "-gencode=arch=compute_80,code=sm_80",
            "-I",
            str(tmp_path),
            str(tmp_path / "probe.cu"),
            "-o",
            str(tmp_path / "probe"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, timeout=60)  # host code only
    assert run.returncode == 0, run.stderr
    got = [list(map(int, line.split())) for line in run.stdout.splitlines()]
    assert got == [list(c.values()) for c in expected]


def test_header_documents_the_fallback_and_masks_the_password(families):
    text = render_dispatch(families, storage_url="postgresql://u:pw@db/x", now=NOW)
    assert "kDefault" in text and "Fallback" in text and "pw@" not in text and "u:***@db/x" in text
    for fam in families:
        assert f"namespace {fam.space.name} {{" in text
        for e in fam.entries:
            assert e.chosen.study_name in text


# -- command line --------------------------------------------------------------------------------
def _error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[")]
    assert len(err) == 1 and err[0].startswith("flashtune export: error: "), err
    return err[0]


def test_cli_dispatch_by_pattern(studies, storage_url, tmp_path, capsys):
    out = tmp_path / "dispatch.h"
    assert main(["export", "--dispatch", "--study", f"disp-{FAMILY}-*", "--storage", storage_url, "-o", str(out)]) == 0
    text = out.read_text()
    assert f"namespace {FAMILY} {{" in text and text.count(f"// study disp-{FAMILY}-") == 8


def test_cli_dispatch_by_suite_lists_what_is_not_covered(studies, storage_url, tmp_path, capsys):
    suite = tmp_path / "sweep.toml"
    suite.write_text(
        f'family = "{FAMILY}"\n\n[grid]\ndtype = ["fp16", "bf16"]\ncausal = [false, true]\n'
        f"head_dim = 128\nheads = 16\nseqlen = [512, 4096, 16384]\ntokens = 16384\n"
    )
    out = tmp_path / "suite.h"
    assert main(["export", "--dispatch", "--suite", str(suite), "--storage", storage_url, "-o", str(out)]) == 0
    text = out.read_text()
    assert text.count(f"// study disp-{FAMILY}-") == 8
    assert "Not covered" in text and "fp16-d128-causal-b1-h16-n16384" in text
    assert "has no study yet" in capsys.readouterr().err


def test_a_study_without_a_successful_trial_is_left_out_with_a_warning(studies, storage_url, tmp_path, capsys):
    started = open_fake_study(storage_url, f"disp-{FAMILY}-started", load_space(FAMILY), problem("fp16", False, 1024))
    assert not [t for t in started.get_trials() if t.state.is_finished()]  # only its enqueued default
    out = tmp_path / "partial.h"
    assert main(["export", "--dispatch", "--study", f"disp-{FAMILY}-*", "--storage", storage_url, "-o", str(out)]) == 0
    text = out.read_text()
    assert text.count(f"// study disp-{FAMILY}-") == 8  # the finished ones
    assert f"disp-{FAMILY}-started left out: study 'disp-{FAMILY}-started' has no successful trial" in text
    assert f"study disp-{FAMILY}-started left out" in capsys.readouterr().err
    assert main(["export", "--dispatch", "--study", f"disp-{FAMILY}-started", "--storage", storage_url]) == 2
    assert "error: none of the 1 selected studies can be exported" in capsys.readouterr().err.splitlines()[-1]


def test_cli_dispatch_errors(studies, storage_url, capsys):
    assert main(["export", "--dispatch", "--study", "nothing-*", "--storage", storage_url]) == 2
    assert "no flashtune study" in _error(capsys)
    assert main(["export", "--dispatch", "--storage", storage_url]) == 2
    assert "--dispatch needs" in _error(capsys)


def test_the_json_says_which_entries_are_their_studys_kept_default(families):
    """An entry whose re-timing kept the default is marked kept_default in the JSON and reads back so; a JSON of
    format 1 (no kept_default) reads back as not saying; a table marking only some entries is refused."""
    import dataclasses

    from tuner.export import DispatchFamily, TableError, table_from_json

    family = next(f for f in families if f.space.name == FAMILY)
    first, *rest = family.entries
    kept = dataclasses.replace(first, chosen=dataclasses.replace(first.chosen, beats_default=False))
    won = [dataclasses.replace(e, chosen=dataclasses.replace(e.chosen, beats_default=True)) for e in rest]
    data = DispatchFamily(space=family.space, entries=(kept, *won)).table().to_json()
    assert [e["kept_default"] for e in data["entries"]] == [True] + [False] * len(won)
    table = table_from_json(data, "test.json")
    assert table.kept_defaults == {kept.key}
    assert table.kept_default(first.dtype, first.head_dim, first.causal, first.seqlen) is True
    assert all(table.kept_default(e.dtype, e.head_dim, e.causal, e.seqlen) is False for e in won)
    assert table.kept_default("fp16", 77, False, 512) is None  # no entry of that head dim: the default, unsaid

    older = {**data, "entries": [{k: v for k, v in e.items() if k != "kept_default"} for e in data["entries"]]}
    assert table_from_json(older, "old.json").kept_defaults is None
    assert table_from_json(older, "old.json").kept_default(first.dtype, first.head_dim, first.causal, 512) is None
    mixed = {**data, "entries": [older["entries"][0], *data["entries"][1:]]}
    with pytest.raises(TableError, match="kept_default must be given for every entry or for none"):
        table_from_json(mixed, "mixed.json")
    wrong = {**data, "entries": [{**data["entries"][0], "kept_default": 1}, *data["entries"][1:]]}
    with pytest.raises(TableError, match="kept_default must be true or false"):
        table_from_json(wrong, "wrong.json")


def test_the_json_records_what_each_winner_was_timed_against_and_finds_those_whose_default_moved(families):
    """Each study record names its problem and the default its study measured. While today's space gives that
    problem the same default, nothing has moved; a record whose timed default differs from today's (a rule
    changed since) is named with the knobs that moved, unless its entry is a kept default (a call of the bucket
    gets its own default then) or the record predates timed_default."""
    import json

    from tuner.devices import limits_for_arch
    from tuner.export import moved_defaults, render_dispatch_json

    device = limits_for_arch(80)
    document = json.loads(render_dispatch_json(families, storage_url="sqlite:///x.db", now=NOW))
    records = document["studies"]
    assert records and all(r["problem"] and r["timed_default"] for r in records)
    chosen = {e.chosen.study_name: e.chosen for f in families for e in f.entries}
    for record in records:
        c = chosen[record["study"]]
        assert Problem.from_dict(record["problem"]) == c.problem and record["timed_default"] == c.timed_default
        assert not c.default_moved
    assert moved_defaults(document, device) == []

    first = records[0]
    space = load_space(first["family"])
    knob = next(k for k in space.knobs if len(k.values) > 1)
    other = next(v for v in knob.values if v != first["timed_default"][knob.name])
    moved = {**first, "timed_default": {**first["timed_default"], knob.name: other}}
    today = first["timed_default"][knob.name]
    for family in document["families"]:
        for entry in family["entries"]:
            entry["kept_default"] = False
    found = moved_defaults({**document, "studies": [moved, *records[1:]]}, device)
    assert found == [
        f"{first['study']}: its winner was timed against a default that has moved ({knob.name} {other} -> {today})"
    ]
    older = {k: v for k, v in moved.items() if k != "timed_default"}
    assert moved_defaults({**document, "studies": [older, *records[1:]]}, device) == []
    for family in document["families"]:
        for entry in family["entries"]:
            entry["kept_default"] = True
    assert moved_defaults({**document, "studies": [moved, *records[1:]]}, device) == []


def test_export_warns_of_a_winner_timed_against_a_default_that_has_moved(studies, storage_url, tmp_path, capsys):
    """The space's default at a study's problem changes after the study ran (here by a patched rule): the
    export still writes the table, and warns of each winner so timed, with the command that times it again."""
    from tuner.space import Space

    plain = Space.defaults

    def moved(self, *args, **kwargs):
        config = plain(self, *args, **kwargs)
        knob = next(k for k in self.knobs if len(k.values) > 1)
        return {**config, knob.name: next(v for v in knob.values if v != config[knob.name])}

    pattern = f"disp-{FAMILY}-*"
    assert (
        main(["export", "--dispatch", "--study", pattern, "--storage", storage_url, "-o", str(tmp_path / "a.h")]) == 0
    )
    assert "has moved" not in capsys.readouterr().err and "timed against a default" not in capsys.readouterr().err
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Space, "defaults", moved)
        out = tmp_path / "moved.h"
        assert main(["export", "--dispatch", "--study", pattern, "--storage", storage_url, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.exists() and err.count("was timed against a default that today's space no longer gives") == 8
    assert f"`flashtune bench --study disp-{FAMILY}-" in err


def test_a_study_that_kept_its_default_is_not_warned_of_when_the_default_moves(families):
    """A kept default is served as the call's own default with today's rules, so only a winner is warned of."""
    import dataclasses
    import io

    from tuner.export._dispatch import _warn_of_moved_defaults

    chosen = next(e.chosen for f in families for e in f.entries if f.space.name == FAMILY)
    knob = next(k for k in chosen.space.knobs if len(k.values) > 1)
    timed = dict(chosen.space.defaults(problem=chosen.problem, device=chosen.device))
    timed[knob.name] = next(v for v in knob.values if v != timed[knob.name])
    moved = dataclasses.replace(chosen, timed_default=timed, is_default=False)
    assert moved.default_moved
    for beats, warned in ((True, 1), (None, 1), (False, 0)):
        log = io.StringIO()
        _warn_of_moved_defaults([dataclasses.replace(moved, beats_default=beats)], log)
        assert log.getvalue().count("was timed against a default") == warned, beats
