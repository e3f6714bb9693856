"""``flashtune tune --model config.json``: a model's attention shapes written as a suite file, then tuned
as ``tune --suite`` tunes one (:func:`write_model_suite`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..errors import UsageError
from ..text import printable
from . import _gpus
from ._args import explicit_problem_flags, resolve_family

__all__ = ["write_model_suite"]

#: problem flags the model config decides (with --model they would be ignored, so they are refused)
_FROM_THE_MODEL = ("--heads", "--kv-heads", "--head-dim", "--seqlen-k")


def _suite_path(args: argparse.Namespace, name: str) -> Path:
    if args.model_suite:
        return Path(args.model_suite)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name.rsplit("/", 1)[-1]).strip("-.")[:80] or "model"
    return Path(f"{slug}-attention.toml")


def _check_flags(args: argparse.Namespace) -> None:
    if args.suite:
        raise UsageError("--model writes and tunes its own suite; give one of --model and --suite")
    if args.study:
        raise UsageError("--study names one study; with --model every shape gets its default study name")
    given = [f for f in explicit_problem_flags(args) if f in _FROM_THE_MODEL]
    if given:
        raise UsageError(f"{', '.join(given)}: the model config gives these with --model; leave them out")


def write_model_suite(args: argparse.Namespace) -> str:
    """Read ``--model``, write its problems as a suite file (the same file again when rerun; another file
    of that name is never replaced) and return the file's path for ``tune --suite``."""
    from ..files import MAX_TEXT_BYTES, FileContentError, check_output_path, read_limited, write_text
    from ..study import DEFAULT_STORAGE, load_suite, mask_url, model_shapes, model_suite_text

    _check_flags(args)
    dtype = args.dtype if "--dtype" in explicit_problem_flags(args) else None
    seqlens = args.seqlens or (args.seqlen,)
    shapes = model_shapes(args.model, seqlens=seqlens, batch=args.batch, dtype=dtype, causal=args.causal or None)
    family = resolve_family(args, shapes.problems, gpu=_gpus.parse(args.gpus)[0])
    # the suite names its storage when one was given, unless the URL holds a password (kept out of files)
    storage = args.storage if args.storage != DEFAULT_STORAGE and mask_url(args.storage) == args.storage else None
    text = model_suite_text(family, shapes, str(args.model), storage)
    path = _suite_path(args, shapes.name)
    if path.exists():
        try:
            same = read_limited(path, MAX_TEXT_BYTES, what="the model's suite file")[1] == text.encode()
        except FileContentError:
            same = False
        if not same:
            raise UsageError(
                f"{printable(path, 200)} exists and is not this model's suite; move it away or name another "
                "file with --model-suite"
            )
    else:
        write_text(text, check_output_path(path))
    load_suite(path)  # the family runs every shape (else one line naming the one it does not)
    print(
        f"suite {printable(path, 200)}: {len(shapes.problems)} attention shapes of {printable(shapes.name, 120)} "
        f"({family}); afterwards `flashtune export --dispatch --suite {printable(path, 200)} -o dispatch.h` "
        "writes dispatch.json for tuned=",
        file=sys.stderr,
    )
    return str(path)
