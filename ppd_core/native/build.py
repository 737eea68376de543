"""Build llama.cpp's JSON-schema converter as a small shared library (the set-up runs this; about 30 s).

    python -m ppd_core.native.build VERSION OUT

VERSION: the llama-cpp-python whose vendored llama.cpp to build from (its sdist, through pip, whose cache answers
a repeat); OUT: the library to write (it depends on nothing but the C++ runtime: ``ppd_core.native.schema``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

WRAPPER = Path(__file__).with_name("schema_grammar.cpp")
SOURCES = ["json-schema-to-grammar.cpp", "json-schema.cpp", "json.cpp", "trie.cpp", "unicode.cpp"]  # in common/
TREES = ("common/", "include/", "ggml/include/", "vendor/")  # what the sources include


def vendored_llama_cpp(version: str, into: Path) -> Path:
    """The parts of llama.cpp the converter needs, from llama-cpp-python's sdist."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(into)], check=True)
    sdist = next(into.glob("llama_cpp_python-*.tar.gz"))
    source = into / "llama.cpp"
    with tarfile.open(sdist) as archive:
        prefix = f"{archive.getnames()[0].split('/')[0]}/vendor/llama.cpp/"
        members = []
        for member in archive.getmembers():
            name = member.name[len(prefix):] if member.name.startswith(prefix) else ""
            if name.startswith(TREES):
                member.name = name
                members.append(member)
        archive.extractall(source, members=members, filter="data")
    return source


def build(version: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as work:
        source = vendored_llama_cpp(version, Path(work))
        compiler = os.environ.get("CXX") or shutil.which("c++") or "g++"
        library = Path(work) / out.name
        command = [compiler, "-O2", "-std=c++17", "-fPIC", "-shared", *(f"-I{source / d}" for d in TREES),
                   str(WRAPPER), *(str(source / "common" / name) for name in SOURCES), "-o", str(library)]
        subprocess.run(command, check=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(library, out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    build(sys.argv[1], Path(sys.argv[2]))
