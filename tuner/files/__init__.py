"""Reading and writing the files flashtune is handed: bounded, content-keyed reads and safe output.

- :func:`read_content`: the digest and bytes of a small file that may change while the process
  runs (a space file, a config header, a dispatch JSON), read again only when its ``stat``
  changes; :func:`read_limited` reads a regular file up to a size limit.
- :func:`check_output_path` / :func:`write_text`: ``-o FILE`` checked before the work starts,
  then written atomically over a regular file, or straight through to a stream
  (:func:`is_stream`: ``/dev/stdout``, a pipe, a terminal).
"""

from ._read import FileContentError, read_content, read_limited
from ._write import OutputError, check_output_path, is_stream, write_text

__all__ = [
    "FileContentError",
    "OutputError",
    "check_output_path",
    "is_stream",
    "read_content",
    "read_limited",
    "write_text",
]
