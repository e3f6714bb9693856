"""Tuned configs out of the study database and back: C/C++ headers and the dispatch table.

- :func:`export_study` / :func:`render_header`: one study's winner as a header of ``#define``\\ s
  that the kernel builds with (``flashtune export``); :func:`read_header` reads one back.
- :func:`collect_dispatch` / :func:`render_dispatch`: one C++17 header whose ``select()`` picks a
  config per shape across studies (``flashtune export --dispatch``), and its tables as JSON
  (:func:`render_dispatch_json`, :class:`DispatchTable`), which ``tuner.attention(config="auto")`` reads;
  :func:`moved_defaults` finds its winners timed against a default that today's space no longer gives.

Reading a header or a dispatch table needs no Optuna: the study database is opened only by
the functions that read studies.
"""

from ._dispatch import (
    DispatchError,
    DispatchFamily,
    DispatchSelection,
    build_dispatch,
    collect_dispatch,
    moved_defaults,
    render_dispatch,
    render_dispatch_json,
)
from ._header import comment_text, export_study, read_header, render_header
from ._read_header import MAX_HEADER_BYTES, HeaderError, decode_header, header_family, parse_header
from ._table import JSON_FORMAT, READABLE_FORMATS, DispatchTable, TableError, table_from_json

__all__ = [
    "JSON_FORMAT",
    "MAX_HEADER_BYTES",
    "READABLE_FORMATS",
    "DispatchError",
    "DispatchFamily",
    "DispatchSelection",
    "DispatchTable",
    "HeaderError",
    "TableError",
    "build_dispatch",
    "collect_dispatch",
    "comment_text",
    "decode_header",
    "export_study",
    "header_family",
    "moved_defaults",
    "parse_header",
    "read_header",
    "render_dispatch",
    "render_dispatch_json",
    "render_header",
    "table_from_json",
]
