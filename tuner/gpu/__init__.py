"""TODO tuner.gpu."""

from ._jobs import TOLERANCES, MeasureJob, MeasureResult, MeasureSettings, Status, measure_job_for

__all__ = ["TOLERANCES", "MeasureJob", "MeasureResult", "MeasureSettings", "Status", "measure_job_for"]
