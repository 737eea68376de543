"""Models from the Hugging Face Hub: ``hf:OWNER/REPO`` (a safetensors repository) or ``hf:OWNER/REPO:FILE.gguf``.

Downloads go through ``huggingface_hub`` (its cache, resumable downloads, progress bars, ``HF_ENDPOINT``,
``HF_TOKEN``); a model already in the cache loads with no network. Every failure is one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ppd_core.errors import PpdError

PREFIX = "hf:"
# what a transformers causal LM needs from a repository (weights, config, tokenizer, chat template)
MODEL_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]


class HubError(PpdError):
    """A Hub model that cannot be had: no network, unknown, gated, or not there."""


@dataclass(frozen=True)
class HubModel:
    repo: str  # OWNER/REPO
    file: str | None = None  # one GGUF file of the repository, or None: the repository's safetensors model

    @property
    def name(self) -> str:
        """The model's name in ppd (profiles, prompt tokens): the GGUF file's stem or the repository's name."""
        return Path(self.file).stem if self.file else self.repo.split("/")[-1]

    def __str__(self) -> str:
        return PREFIX + self.repo + (f":{self.file}" if self.file else "")


def parse(model: str) -> HubModel | None:
    """``hf:OWNER/REPO[:FILE.gguf]`` as a HubModel; None for anything else; HubError for a malformed one."""
    if not model.startswith(PREFIX):
        return None
    repo, _, file = model.removeprefix(PREFIX).partition(":")
    owner, _, name = repo.partition("/")
    if not owner or not name or "/" in name:
        raise HubError(f"{model!r}: write a Hub model as hf:OWNER/REPO or hf:OWNER/REPO:FILE.gguf")
    if file and not file.endswith(".gguf"):
        raise HubError(f"{model!r}: the file after the repository must be a .gguf file")
    return HubModel(repo, file or None)


def fetch(model: HubModel, progress: Callable[[str, int, int], None] | None = None) -> Path:
    """The model on disk (a snapshot directory, or the GGUF file), downloaded into the Hub cache if it is not there;
    ``progress("downloading", done, total)`` hears the download (megabytes, or files for a repository's count)."""
    return _download(model, reporting_bars(progress))


def reporting_bars(progress: Callable[[str, int, int], None] | None):
    """A tqdm class whose bars also report to ``progress`` (plain tqdm: its bars show even where transformers turned
    the Hub's own off)."""
    from tqdm import tqdm

    if progress is None:
        return tqdm

    class Reporting(tqdm):
        def update(self, n=1):
            shown = super().update(n)
            if self.total:
                scale = 2**20 if self.unit == "B" else 1
                progress("downloading", int(self.n // scale), int(self.total // scale))
            return shown

    return Reporting


def _download(model: HubModel, bars) -> Path:
    import huggingface_hub
    from huggingface_hub import errors

    try:
        if model.file:
            return Path(huggingface_hub.hf_hub_download(model.repo, model.file, tqdm_class=bars))
        return Path(huggingface_hub.snapshot_download(model.repo, allow_patterns=MODEL_FILES, tqdm_class=bars))
    except errors.GatedRepoError:
        raise HubError(f"{model} is gated: accept its terms on the Hub and set HF_TOKEN (or `hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise HubError(f"{model}: no such repository on the Hub (or it is private: set HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise HubError(f"{model}: no such revision on the Hub") from None
    except errors.RemoteEntryNotFoundError:
        raise HubError(f"{model}: the repository has no file {model.file}") from None
    except errors.LocalEntryNotFoundError:
        raise HubError(f"{model} is not in the Hub cache and the Hub cannot be reached (no network, or HF_HUB_OFFLINE)") from None
    except errors.HfHubHTTPError as error:
        raise HubError(f"{model}: the Hub answered {one_line(error)}") from None
    except OSError as error:  # a full disk, an unwritable cache
        raise HubError(f"{model}: could not download ({error.strerror or error})") from None


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200]
