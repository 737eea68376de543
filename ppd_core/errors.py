"""The project's own error type for bad input.

``PpdError`` marks a problem the user can fix (a missing file, a bad option value, a port in
use); its message is one line, and the command line prints it as ``ppd: error: <message>``
with exit code 2. Any other exception is a bug and keeps its traceback.

It subclasses ``ValueError`` so that callers catching ``ValueError`` keep working.
"""

from __future__ import annotations


class PpdError(ValueError):
    """Bad input the user can fix; the message is one line."""
