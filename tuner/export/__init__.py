"""TODO tuner.export."""

from ._dispatch import DispatchError, build_dispatch, collect_dispatch, render_dispatch, render_dispatch_json
from ._header import ExportError, choose, comment_text, export_study, read_header, render_header
from ._table import JSON_FORMAT, DispatchTable, TableError, table_from_json
from ._read_header import HeaderError, MAX_HEADER_BYTES, decode_header, parse_header

__all__ = ['JSON_FORMAT', 'DispatchTable', 'TableError', 'table_from_json', 'DispatchError', 'ExportError', 'HeaderError', 'MAX_HEADER_BYTES', 'build_dispatch', 'choose', 'collect_dispatch', 'comment_text', 'decode_header', 'export_study', 'parse_header', 'read_header', 'render_dispatch', 'render_dispatch_json', 'render_header']
