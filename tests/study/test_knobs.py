"""How studies store their knobs: the metric name and integer-stored ordered knobs on new studies, and
studies made before that (the H200 sweeps in tests/data) resuming with their categorical knobs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

import tuner.study as st
from tests.conftest import toy_space_text
from tests.fakes.fake_compile import fake_compiler
from tests.fakes.fake_measure import FakeMeasure
from tuner.devices import DeviceLimits
from tuner.gpu import MeasureResult
from tuner.run import TuneSettings, tune
from tuner.search import make_sampler, make_search
from tuner.space import load_space

DATA = Path(__file__).resolve().parents[1] / "data"
SPACES = [DATA / "sm90_small.toml", *sorted((DATA / "sweep_spaces").glob("*.toml"))]
GPU = {"name": "Fake GPU", "arch": 80, "num_sms": 108, "smem_per_block_optin": 166912, "regs_per_sm": 65536}


def _tune(study, space, problem, device, measure, n_trials):
    search = make_search("random", space, problem, device, 0)
    settings = TuneSettings(n_trials=n_trials, compile_workers=1)
    return tune(study, space, problem, device, measure, settings, search=search, compiler=fake_compiler)


def test_a_new_study_names_its_metric_and_stores_ordered_knobs_as_integers(sqlite_url, tmp_path, problem, sm80):
    text = toy_space_text().replace('help = "K/V ring depth"', 'help = "K/V ring depth"\nordered = false', 1)
    (tmp_path / "toy.toml").write_text(text)
    space = load_space(tmp_path / "toy.toml")
    storage = st.open_storage(sqlite_url)
    study = st.open_study(
        storage=storage, name="new", space=space, problem=problem, gpu=GPU, sampler=make_sampler("random", space, 0)
    )
    _tune(study, space, problem, sm80, FakeMeasure(), 6)

    reloaded = optuna.load_study(study_name="new", storage=sqlite_url)
    assert reloaded.metric_names == ["TFLOPS"]
    trials = [t for t in reloaded.get_trials() if t.params]
    assert len(trials) >= 6
    for t in trials:
        assert space.validate(t.params) == t.params  # values come back as the knobs' own integers
        for k in space.knobs:
            dist = t.distributions[k.name]
            if k.ordered:  # a numeric axis in Optuna's tools: the values in their order, not first-seen order
                assert isinstance(dist, IntDistribution)
                assert (dist.low, dist.high) == (min(k.values), max(k.values))
                assert all(dist._contains(float(v)) for v in k.values)
            else:
                assert dist == CategoricalDistribution(list(k.values))
    assert any(isinstance(d, CategoricalDistribution) for d in trials[0].distributions.values())


@pytest.mark.parametrize(
    "values",
    [(32, 64, 128), (1, 2, 3, 4), (0, 8, 16, 48), (7,), (128, 64, 32), (24, 40, 168, 232)],
)
def test_every_value_of_an_ordered_knob_lies_on_its_integer_grid(values):
    from tuner.space import Knob

    knob = Knob(name="k", macro="K", values=values, default=values[0], help="")
    dist = st.knob_distribution(knob, "steps")
    assert isinstance(dist, IntDistribution)
    assert [dist.to_external_repr(dist.to_internal_repr(v)) for v in values] == list(values)
    assert all(dist._contains(dist.to_internal_repr(v)) for v in values)


def _space_of(meta):
    """The space file the sweep was measured with: its digest, and of two spaces with one digest (the same knobs and
    values, as sm90_sweep_d128c and d128d have) the one of the study's family."""
    matches = [space for space in map(load_space, SPACES) if st.space_digest(space) == meta.space_digest]
    return next((s for s in matches if s.name == meta.family), matches[0] if matches else None)


class _Flat:
    """A GPU stand-in for any space: every config ok at one figure."""

    def prepare(self, problem, settings):
        pass

    def measure(self, job):
        return MeasureResult(status="ok", latency_ms=1.0, tflops=100.0, reps=10, spread=0.01, rel_error=1e-4)


@pytest.mark.parametrize("db", sorted(DATA.glob("*.db")), ids=lambda p: p.stem)
def test_a_stored_sweep_resumes_with_the_knob_encoding_it_was_stored_with(db, tmp_path):
    """The sweeps measured before the encoding existed keep their categorical knobs; later ones ("steps") keep
    their integer-stored ordered knobs. Either way a resumed trial is suggested through the stored distributions."""
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    copy = tmp_path / db.name
    shutil.copyfile(db, copy)
    url = f"sqlite:///{copy}"
    storage = st.open_storage(url, create=False, read_only=False)
    (summary,) = optuna.get_all_study_summaries(storage, include_best_trial=False)
    stored = optuna.load_study(study_name=summary.study_name, storage=storage)
    meta = st.StudyMeta.read(stored)
    space = _space_of(meta)
    if space is None:
        pytest.skip(f"no space file in tests/data matches {db.name}'s space digest")
    stored_distributions = stored.get_trials()[0].distributions
    assert st.knob_distributions(space, stored.user_attrs) == stored_distributions

    reopen = dict(
        storage=storage,
        name=summary.study_name,
        space=space,
        problem=meta.problem,
        gpu=meta.gpu,
        sampler=make_sampler("random", space, 0),
    )
    recorded = meta.kernel.get("source_digest")
    if recorded is not None and recorded != space.source_digest():
        # measured on kernel sources since changed: its timings are of another kernel, and it says so
        with pytest.raises(st.StudyError, match=r"sources of kernel family .* changed"):
            st.open_study(**reopen)
        assert hashlib.sha256(db.read_bytes()).hexdigest() == before
        return
    study = st.open_study(**reopen)
    held = len([t for t in study.get_trials() if st.is_evaluated(t)])
    default = space.defaults(meta.problem.head_dim)
    study.enqueue_trial(default)  # read back through Optuna's suggest, which checks the stored distributions
    device = DeviceLimits.from_info(meta.gpu)
    result = _tune(study, space, meta.problem, device, _Flat(), held + 2)
    # an exhaustive sweep has no unseen feasible config: the default comes back as a stored duplicate
    assert result.evaluated + result.duplicates >= 1
    new = study.get_trials()[-1]
    assert new.number >= summary.n_trials and new.params == default and new.state.is_finished()
    assert new.distributions == stored_distributions
    if st.KNOB_ENCODING not in stored.user_attrs:  # made before the encoding: every knob categorical
        assert all(isinstance(d, CategoricalDistribution) for d in new.distributions.values())
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # the stored file itself is untouched
