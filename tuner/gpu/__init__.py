"""Everything that needs a GPU (CuPy device code, events, the reference) lives here and nowhere else.

Nothing outside this package imports it at module level: the tuner talks to it through the
worker process (``tuner.worker``) or lazily (``tuner.attention``).
"""
