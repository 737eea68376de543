"""Native helpers built at set-up from llama.cpp's own source (``build``) and loaded with ctypes."""
