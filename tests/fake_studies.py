"""Fake flashtune studies for tests without a GPU.

A study is opened exactly as ``flashtune tune`` opens it (:func:`tuner.study.open_study`, so
it carries the same study attributes and the enqueued default trial), then filled with
trials that carry the user attributes :mod:`tuner.tune` sets: status, reason, resources,
measurement, compile, is_default. TFLOPS come from a made-up function of the knobs.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner import study as st
from tuner.devices import DeviceLimits
from tuner.problem import Problem
from tuner.space import Space, available_families, config_key, load_space

H200_INFO: dict[str, Any] = {
    "name": "NVIDIA H200",
    "index": 0,
    "arch": 90,
    "num_sms": 132,
    "smem_per_block_optin": 232448,
    "regs_per_sm": 65536,
    "l2_bytes": 62914560,
    "driver": "580.65",
    "cuda_runtime": 13000,
    "cupy": "14.0.0",
}
A100_INFO: dict[str, Any] = dict(
    H200_INFO, name="NVIDIA A100-SXM4-80GB", arch=80, num_sms=108, smem_per_block_optin=166912
)


def family_for_tests() -> str:
    """sm80 when its space file exists (runs on any GPU from sm_80), else the first family there is."""
    families = available_families()
    return "sm80" if "sm80" in families else families[0]


def gpu_for(space: Space) -> dict[str, Any]:
    """An H200: every family runs there (sm80 compiled for sm_90, sm90 natively)."""
    return H200_INFO


def fake_tflops(space: Space, config: dict[str, int]) -> float:
    """Deterministic, knob-dependent: the first knob matters most, the second less, the rest a little."""
    value = 200.0
    for i, knob in enumerate(space.knobs):
        position = knob.values.index(config[knob.name]) / max(1, len(knob.values) - 1)
        if i < 2:
            value += (60.0, 25.0)[i] * position
        else:
            value += 3.0 * (zlib.crc32(f"{knob.name}{position}".encode()) % 7) / 7
    return round(value, 3)


def _resources(config: dict[str, int]) -> dict[str, int]:
    h = zlib.crc32(config_key(config).encode())
    registers = 96 + 8 * (h % 20)
    spills = 0 if registers < 230 else 64 * (h % 5)
    return {
        "registers": registers,
        "spill_store_bytes": spills,
        "spill_load_bytes": spills,
        "stack_bytes": 0,
        "static_smem_bytes": 0,
    }


def _measured_attrs(config: dict[str, int], problem: Problem, tflops: float) -> dict[str, Any]:
    latency_ms = problem.flops / (tflops * 1e12) * 1e3
    return {
        st.STATUS: "ok",
        st.CONFIG_KEY: config_key(config),
        st.RESOURCES: _resources(config),
        st.COMPILE: {"seconds": 12.5, "cached": False, "arch": "90"},
        st.MEASUREMENT: {
            "latency_ms": latency_ms,
            "spread": 0.012,
            "reps": 100,
            "tflops": tflops,
            "rel_error": 1e-3,
            "lse_error": 1e-4,
        },
    }


def open_fake_study(
    storage: optuna.storages.BaseStorage | str,
    name: str,
    space: Space,
    problem: Problem,
    gpu: dict[str, Any] | None = None,
) -> optuna.Study:
    """An empty study, created the way ``flashtune tune`` creates it (default config enqueued)."""
    return st.open_study(
        storage=storage,
        name=name,
        space=space,
        problem=problem,
        gpu=gpu or gpu_for(space),
        sampler=optuna.samplers.RandomSampler(seed=0),
    )


def fill_study(
    study: optuna.Study,
    space: Space,
    problem: Problem,
    *,
    n_trials: int = 30,
    seed: int = 0,
    failures: bool = True,
    tflops_scale: float = 1.0,
) -> optuna.Study:
    """Measure the default, then ``n_trials`` distinct random configs: feasible ones COMPLETE with fake
    TFLOPS, up to a quarter infeasible ones PRUNED with the space's reason; with ``failures`` a few
    compile errors, wrong results and an interrupted trial too."""
    device = DeviceLimits.from_info(study.user_attrs["gpu"])
    dists = st.knob_distributions(space, study.user_attrs)  # as the study stores its knobs
    rng = random.Random(seed)
    # the enqueued default config (or, in a resumed study, the next enqueued one), told as tune.py tells a
    # measured trial; a resumed study without one gets only the random configs below
    seen = {config_key(t.params) for t in study.get_trials(deepcopy=False) if t.params}
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = study.ask(dists)
        config = space.validate(trial.params)
        tflops = fake_tflops(space, config) * tflops_scale
        for key, value in _measured_attrs(config, problem, tflops).items():
            trial.set_user_attr(key, value)
        study.tell(trial, tflops)
        seen.add(config_key(config))
    trials = []
    infeasible = 0
    for _ in range(200 * n_trials):
        if len(trials) >= n_trials:
            break
        config = {k.name: rng.choice(k.values) for k in space.knobs}
        key = config_key(config)
        attrs: dict[str, Any] = {st.CONFIG_KEY: key}
        if key in seen:
            continue
        reason = space.check(config, problem, device)
        if reason and infeasible >= n_trials // 4:
            continue
        seen.add(key)
        n = len(trials)
        if reason:
            infeasible += 1
            attrs.update({st.STATUS: "infeasible", st.REASON: reason})
            trials.append(
                optuna.trial.create_trial(state=TrialState.PRUNED, params=config, distributions=dists, user_attrs=attrs)
            )
            continue
        if failures and n % 11 == 5:
            attrs.update({st.STATUS: "compile_error", st.REASON: "nvcc failed: error: static assertion failed"})
            trials.append(
                optuna.trial.create_trial(state=TrialState.PRUNED, params=config, distributions=dists, user_attrs=attrs)
            )
            continue
        if failures and n % 13 == 7:
            attrs.update(_measured_attrs(config, problem, 1.0))
            attrs.update(
                {st.STATUS: "wrong_result", st.REASON: "O relative error 0.5 > 0.004 at batch 0, head 1 </script><b>"}
            )
            trials.append(
                optuna.trial.create_trial(state=TrialState.PRUNED, params=config, distributions=dists, user_attrs=attrs)
            )
            continue
        tflops = fake_tflops(space, config) * tflops_scale
        attrs.update(_measured_attrs(config, problem, tflops))
        trials.append(optuna.trial.create_trial(value=tflops, params=config, distributions=dists, user_attrs=attrs))
    if failures:
        trials.append(
            optuna.trial.create_trial(
                state=TrialState.FAIL,
                params=space.defaults(),
                distributions=dists,
                user_attrs={st.STATUS: "interrupted"},
            )
        )
    study.add_trials(trials)
    return study


def set_winner(study: optuna.Study, space: Space, problem: Problem) -> dict[str, Any]:
    """A re-timed winner as :func:`tuner.retime.retime_top` stores it: the best trial and the default,
    each 2% slower than when first measured."""
    complete = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if st.DUPLICATE_OF not in t.user_attrs]
    best = max(complete, key=lambda t: t.value)
    default = st.default_trial(study)
    tflops = best.value * 0.98
    latency = problem.flops / (tflops * 1e12) * 1e3
    default_latency = problem.flops / (default.value * 0.98 * 1e12) * 1e3
    entry = {
        "config": space.validate(best.params),
        "trial": best.number,
        "latency_ms": latency,
        "tflops": tflops,
        "default_latency_ms": default_latency,
        "speedup_over_default": default_latency / latency,
        "rounds": 3,
        "candidates": [
            {"trial": best.number, "latency_ms": latency, "tflops": tflops},
            {"trial": default.number, "latency_ms": default_latency, "tflops": default.value * 0.98},
        ],
        "date": "2025-01-02T03:04:05+00:00",
        "seen_trials": sorted(t.number for t in study.get_trials(states=(TrialState.COMPLETE,))),
    }
    study.set_user_attr(st.WINNER, entry)
    return entry


def make_study(
    storage_url: str,
    name: str,
    family: str | None = None,
    problem: Problem | None = None,
    *,
    n_trials: int = 30,
    seed: int = 0,
    winner: bool = True,
    **fill: Any,
) -> optuna.Study:
    space = load_space(family or family_for_tests())
    problem = problem or Problem(batch=4, seqlen_q=2048, heads_q=16, head_dim=128, dtype="fp16")
    study = open_fake_study(storage_url, name, space, problem)
    fill_study(study, space, problem, n_trials=n_trials, seed=seed, **fill)
    if winner:
        set_winner(study, space, problem)
    return study
