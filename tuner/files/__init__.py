"""Reading and writing the files flashtune is handed: bounded, content-keyed reads and safe output.

- :func:`read_content`: the digest and bytes of a small file that may change while the process
  runs (a space file, a config header, a dispatch JSON), read again only when its ``stat``
  changes; :func:`read_limited` reads a regular file up to a size limit.
- :func:`check_output_path` / :func:`write_text`: ``-o FILE`` checked before the work starts,
  then written atomically over a regular file, or straight through to a stream
  (:func:`is_stream`: ``/dev/stdout``, a pipe, a terminal).
- :func:`inputs_noted` / :func:`guard_outputs`: no output of a command is one of its inputs (the
  study database and its journals, the suite, the space file, whatever :func:`read_limited` read).
"""

from ._errors import OutputError
from ._inputs import Input, guard_outputs, inputs_noted, note_input, noted_inputs
from ._read import MAX_TEXT_BYTES, FileContentError, read_content, read_limited, read_toml
from ._write import check_output_path, is_stream, write_text

__all__ = [
    "MAX_TEXT_BYTES",
    "FileContentError",
    "Input",
    "OutputError",
    "check_output_path",
    "guard_outputs",
    "inputs_noted",
    "is_stream",
    "note_input",
    "noted_inputs",
    "read_content",
    "read_limited",
    "read_toml",
    "write_text",
]
