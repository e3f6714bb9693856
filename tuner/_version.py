"""The package version: one place, read by the build (pyproject) and by what records it (headers, studies)."""

__version__ = "0.1.0"
