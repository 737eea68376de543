"""The lean decoding path: a Llama-family forward over a preallocated cache (see ``model.py``)."""
