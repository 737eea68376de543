"""User-facing entry points: the `ppd` command line (and the chat UI)."""
