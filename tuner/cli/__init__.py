"""TODO tuner.cli."""

from ._main import main

__all__ = ['main']
