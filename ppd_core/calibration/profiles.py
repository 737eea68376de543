"""Device profiles: what calibration measured and chose, saved as JSON per device and model.

A profile is keyed by the device (kind, name, memory, threads), the model (name and a
fingerprint of its embedding table), the quantization, the dtype and the prompt tokens, so a
profile made for another machine, model or set of prompt tokens is never used.
"""

from __future__ import annotations

import hashlib
import json
import math
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import platformdirs

from ppd_core.calibration.step_policy import KINDS, StepPolicy
from ppd_core.atomic_files import atomic_write
from ppd_core.errors import PpdError
from ppd_core.tree import TreeFamily, TreeSpec, family_from_specs

FORMAT_VERSION = 5  # 2: lookup chains; 3: their expectation replays decoding step by step; 4: follow-up turns;
# 5: chains by match class, replayed on the decoding backend's own answers


class ProfileError(PpdError):
    """A profile file that cannot be used (corrupt, another format, another key)."""


def profiles_dir() -> Path:
    """Where profiles made on this machine live (the user's data directory)."""
    return Path(platformdirs.user_data_dir("ppd")) / "profiles"


@dataclass
class DeviceProfile:
    """Calibration result for one (device, model, quantization, dtype, prompt tokens) key."""

    key: dict
    latency_ms: dict[int, dict[int, float]]  # context length -> tree tokens -> median step ms
    acceptance: list[list[float]]  # p_d(r): [n][k]
    acceptance_positions: int  # answer positions the acceptance was measured on
    budget: int  # chosen tokens per step
    trees: list[TreeSpec]  # the chosen tree for each available guess depth m = 0..n
    tree_sizes: list[int]
    expected_tokens_per_step: float
    expected_ms_per_step: float
    expected_speedup: float
    ensemble_size: int
    budgets: list[dict] = field(default_factory=list)  # every budget tried: tokens/step, ms/step, tokens/s
    lookup_acceptance: list[list[float]] = field(default_factory=list)  # P(first j chain tokens right | match class c): [c][j]
    lookup_trials: list[int] = field(default_factory=list)  # answer positions with a match of class c
    lookup_lengths: list[int] = field(default_factory=list)  # chosen chain length by match class (0: none)
    expected_tokens_per_step_with_lookup: float = 0.0  # the chosen tree plus those chains
    expected_speedup_with_lookup: float = 0.0
    expected_with_lookup_by_turn: dict[str, dict] = field(default_factory=dict)  # "first turns" / "follow-ups": the same apart
    created: str = ""
    calibration_seconds: float = 0.0
    acceptance_from: str = ""  # the acceptance record used (ppd_core/calibration/records.py): its file
    step_policy: dict = field(default_factory=dict)  # ``StepPolicy.to_json``: how steps are shaped ({}: trees)

    @property
    def key_hash(self) -> str:
        return key_hash(self.key)

    @property
    def policy(self) -> StepPolicy:
        return StepPolicy.from_json(self.step_policy)

    def family(self) -> TreeFamily:
        return family_from_specs(f"calibrated-{self.budget}", self.trees, len(self.acceptance), self.ensemble_size)

    def to_json(self) -> dict:
        data = asdict(self)
        data["format_version"] = FORMAT_VERSION
        data["key_hash"] = self.key_hash
        data["trees"] = [spec.to_json() for spec in self.trees]
        data["latency_ms"] = {str(c): {str(s): ms for s, ms in curve.items()} for c, curve in self.latency_ms.items()}
        return data

    @staticmethod
    def from_json(data: dict) -> DeviceProfile:
        if data.get("format_version") != FORMAT_VERSION:
            raise ProfileError(f"profile format {data.get('format_version')!r}, expected {FORMAT_VERSION}")
        fields = {name: data[name] for name in DeviceProfile.__dataclass_fields__ if name in data}
        try:
            fields["trees"] = [TreeSpec.from_json(items) for items in data["trees"]]
            fields["latency_ms"] = {int(c): {int(s): float(ms) for s, ms in curve.items()} for c, curve in data["latency_ms"].items()}
            profile = DeviceProfile(**fields)
            check_shape(profile)
            profile.family()  # every tree must build
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
            raise ProfileError(f"profile is malformed ({type(error).__name__}: {error})") from None
        return profile


def conforms(value, hint) -> bool:
    """Whether ``value`` (read from JSON) is of the annotated type ``hint``: int, float, str, dict, a dataclass, and
    lists and dicts of those; a float must be finite, a bool is no number."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return isinstance(value, list) and all(conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def check_shape(profile: DeviceProfile) -> None:
    """Every field of the type its annotation says, every latency curve positive ms from 1 token on, the step policy
    one decoding runs: a ValueError naming what is wrong (a start must never trip on it later)."""
    hints = typing.get_type_hints(DeviceProfile)
    wrong = [name for name in hints if not conforms(getattr(profile, name), hints[name])]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} of the wrong type")
    if not profile.trees:
        raise ValueError("no trees")
    for context, curve in profile.latency_ms.items():
        if not curve or min(curve) != 1 or min(curve.values()) <= 0:
            raise ValueError(f"latency_ms at context {context}: not positive ms from 1 token on")
    policy = profile.policy
    if policy.kind not in KINDS or (policy.kind == "fixed" and policy.rows not in policy.fixed_ms):
        raise ValueError(f"step_policy {profile.step_policy!r} is not one decoding can run")


def key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def profile_path(key: dict, folder: Path | None = None) -> Path:
    device = "".join(ch if ch.isalnum() else "-" for ch in str(key.get("device", {}).get("name", "device")))[:40]
    return (folder or profiles_dir()) / f"{key.get('model', {}).get('name', 'model')}-{device}-{key_hash(key)}.json"


def save_profile(profile: DeviceProfile, folder: Path | None = None) -> Path:
    """Write atomically; returns the path."""
    return atomic_write(profile_path(profile.key, folder), json.dumps(profile.to_json(), indent=1) + "\n")


def read_profile(path: Path) -> DeviceProfile:
    """A profile file; raises ProfileError with a one-line reason when it is unusable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ProfileError(f"{path} is not a readable profile ({error})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path} is not a profile object")
    return DeviceProfile.from_json(data)


def set_aside(path: Path) -> Path | None:
    """Move an unusable profile file out of every later start's way, to ``NAME.bad`` beside it (kept, to look at);
    None where it could not be moved."""
    aside = path.with_name(path.name + ".bad")
    try:
        path.replace(aside)
    except OSError:
        return None
    return aside


def load_profile(key: dict, folder: Path | None = None) -> DeviceProfile | None:
    """The saved profile for ``key``: None when there is none; ProfileError when it is corrupt or stale."""
    path = profile_path(key, folder)
    if not path.is_file():
        return None
    profile = read_profile(path)
    if profile.key != key:
        raise ProfileError(f"{path} was made for another device or model")
    return profile
