"""A tuning process with the real loop, storage, heartbeat and recovery, but a CPU stand-in for nvcc and the GPU.

    python -m tests.fakes.standin_tuner STORAGE STUDY N_TRIALS MEASURE_LOG [SLEEP_S]

It creates or resumes STUDY (sm80 space, a fixed problem) and runs ``tuner.run.tune`` with
a compiler that returns a dummy kernel and a measurement that sleeps SLEEP_S and appends
the trial's number to MEASURE_LOG (so tests can count how often each trial was measured).

With ``FLASHTUNE_STANDIN_GATE=PATH`` in the environment, a measurement waits while PATH exists,
and while it waits PATH + ".waiting" exists: a test can hold the tuner inside a measurement
(with a trial to store next) and do something to the storage at that exact point.
"""

from __future__ import annotations

import os
import sys
import time

from tuner.compile import CompiledKernel, CompileOutcome, Resources
from tuner.devices import limits_for_arch
from tuner.gpu import MeasureResult
from tuner.problem import Problem
from tuner.run import MeasureFunction, TuneSettings, tune
from tuner.search import make_sampler, make_search
from tuner.space import load_space
from tuner.study import open_storage, open_study

PROBLEM = Problem(batch=2, seqlen_q=1024, heads_q=8, head_dim=128)
GPU = {"name": "Stand-in GPU", "arch": 80}


def standin_compile(space_path, config, problem, device) -> CompileOutcome:
    if os.environ.get("FLASHTUNE_STANDIN_COMPILE_LOG"):  # tests count compiles, and in which process
        with open(os.environ["FLASHTUNE_STANDIN_COMPILE_LOG"], "a") as f:
            f.write(f"{os.getpid()}\n")
    resources = Resources(registers=128, spill_store_bytes=0, spill_load_bytes=0, stack_bytes=0, static_smem_bytes=0)
    kernel = CompiledKernel(
        cubin_path="/dev/null",
        entry="flashtune_fwd",
        arch="80",
        options=(),
        resources=resources,
        seconds=0.0,
        cached=True,
    )
    return CompileOutcome(status="ok", payload=kernel)


def standin_tflops(config: dict[str, int]) -> float:
    """A deterministic, knob-dependent figure of merit."""
    return 100.0 + sum((i + 1) * v for i, v in enumerate(config.values())) % 97


def main(argv: list[str]) -> int:
    storage_url, study_name, n_trials, log_path = argv[:4]
    sleep_s = float(argv[4]) if len(argv) > 4 else 0.05
    space = load_space("sm80")
    device = limits_for_arch(80)
    storage = open_storage(storage_url)
    for attempt in range(20):  # several processes may race to create the study
        try:
            study = open_study(
                storage=storage,
                name=study_name,
                space=space,
                problem=PROBLEM,
                gpu=GPU,
                sampler=make_sampler("tpe", space, os.getpid()),
            )
            break
        except Exception:
            time.sleep(0.2 * (attempt + 1))
    else:
        raise SystemExit("could not open the study")

    gate = os.environ.get("FLASHTUNE_STANDIN_GATE")

    def measure(job):
        time.sleep(sleep_s)
        if gate and os.path.exists(gate):
            waiting = gate + ".waiting"
            open(waiting, "w").close()
            while os.path.exists(gate):
                time.sleep(0.02)
            os.remove(waiting)
        with open(log_path, "a") as f:
            f.write(f"{job.tag}\n")
        return MeasureResult(status="ok", latency_ms=1.0, tflops=standin_tflops(job.config))

    settings = TuneSettings(
        n_trials=int(n_trials), compile_workers=1, compile_ahead=2, storage_retries=6, storage_retry_delay_s=0.5
    )
    # seeded apart: each stand-in process proposes and explores on its own
    search = make_search("tpe", space, PROBLEM, device, os.getpid())
    summary = tune(
        study,
        space,
        PROBLEM,
        device,
        MeasureFunction(measure),
        settings,
        search=search,
        compiler=standin_compile,
        seed=os.getpid(),
    )
    print(f"stand-in done: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
