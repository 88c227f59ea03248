"""TeXstudio's setup operations: none of its own. Its tasks set up with the core's `write_file` and
`open_file` (coda_env/setup_ops.py): the documents are written to the home and opened at launch."""

from __future__ import annotations

from ...registry import SetupOp

SETUP_OPS: list[SetupOp] = []
