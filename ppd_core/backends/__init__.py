"""The wings: one folder per backend (``llamacpp``, ``torch``), each implementing ``ppd_core.backend``'s protocol
and building its ``BackendInfo``; ``ppd_core.backend_registry`` names the loader of each."""
