"""TODO tuner.files."""

from ._read import FileContentError, read_content, read_limited
from ._write import OutputError, check_output_path, is_stream, write_text

__all__ = ['FileContentError', 'OutputError', 'check_output_path', 'is_stream', 'read_content', 'read_limited', 'write_text']
