"""The ``flashtune`` command line: ``tune``, ``worker``, ``best``, ``studies``, ``check``, ``bench``,
``replay``, ``export`` and ``report``.

:func:`main` (the ``flashtune`` entry point) parses the options (:mod:`._parser`), runs the
command (:mod:`._commands`, :mod:`._bench`) and turns every failure into one line and an exit
status. GPU workers are started through :mod:`._gpus`; nothing needs a GPU before a command does.
"""

from ._main import main

__all__ = ["main"]
