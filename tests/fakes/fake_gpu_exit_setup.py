"""A worker handler whose import kills the process before it can report (a broken driver install)."""

import os

os._exit(7)
