"""A model's config.json (and the files read beside it) from the Hugging Face Hub, through the
`huggingface_hub` library and into its usual cache, so that `--model org/name` plans like a local
folder and works offline once fetched.

Imported only for a Hub id; `huggingface_hub` itself loads only inside `fetch_folder`. The library
honours HF_TOKEN, HF_HOME/HF_HUB_CACHE, HF_ENDPOINT, HF_HUB_OFFLINE and HF_HUB_ETAG_TIMEOUT.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

from kvplan.errors import SpecError, UsageError

CONFIG = "config.json"
# read beside config.json by kvplan.specs.hf.quant (ModelOpt's quantization, the checkpoint's bytes,
# a pooling module) and kvplan.specs.hf.vision_tower (a vision model's processor limits)
SIDECARS = (
    "hf_quant_config.json",
    "model.safetensors.index.json",
    "modules.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
)
ETAG_TIMEOUT_S = 5  # the library's default is 10 s; HF_HUB_ETAG_TIMEOUT still wins when set

# org/name, optionally @revision (branch, tag, commit or refs/pr/N); the library validates the rest
_HUB_ID_RE = re.compile(r"^([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@([\w./-]+))?$")


def looks_like_hub_id(ref: str) -> bool:
    return _HUB_ID_RE.match(ref.strip()) is not None


def split_ref(ref: str) -> tuple[str, str | None]:
    """'org/name@rev' -> ('org/name', 'rev'); without '@' the revision is None (the main branch)."""
    m = _HUB_ID_RE.match(ref.strip())
    if m is None:
        raise UsageError(
            f"--model: {ref!r} is not a Hugging Face repository id (org/name or org/name@revision)"
        )
    return m.group(1), m.group(2)


def fetch_folder(ref: str, unknown: str) -> Path:
    """The cached snapshot folder holding the repository's config.json and whichever sidecars it has.

    `unknown` is the registry's "unknown model" line, which a miss everywhere extends."""
    hub = _import_hub()
    repo_id, revision = split_ref(ref)
    config = _fetch(hub, repo_id, CONFIG, revision, unknown)
    if config is None:
        raise SpecError(
            f"--model: the Hugging Face repository {repo_id} has no {CONFIG} (not a transformers model?); "
            "pass a local config.json or a folder holding one"
        )
    folder = config.parent
    commit = folder.name  # snapshots/<commit>/: the sidecars come from the very same commit
    for name in SIDECARS:
        _fetch(hub, repo_id, name, commit, unknown)
    return folder


def _import_hub() -> ModuleType:
    try:
        import huggingface_hub
    except ImportError:
        raise UsageError(
            "--model: a Hugging Face Hub id needs the huggingface_hub package (pip install huggingface_hub); "
            "or pass a local config.json or a folder holding one"
        ) from None
    return huggingface_hub


def _fetch(hub: ModuleType, repo_id: str, filename: str, revision: str | None, unknown: str) -> Path | None:
    """The file's path in the cache, None when the repository has no such file.

    The cache comes first; an uncached file costs one HEAD request (no retries) before the download,
    so that no network fails in seconds instead of the library's retry loop (~25 s)."""
    cached = hub.try_to_load_from_cache(repo_id, filename, revision=revision)
    if cached is not None and not isinstance(cached, str):
        return None  # the cache records that the file does not exist at this commit
    offline = bool(hub.constants.HF_HUB_OFFLINE)
    if isinstance(cached, str) and (offline or _is_commit(revision)):
        return Path(cached)
    try:
        if cached is None:
            if offline:
                raise hub.errors.OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
            url = hub.hf_hub_url(repo_id, filename, revision=revision)
            hub.get_hf_file_metadata(url, timeout=_etag_timeout(hub))
        # with a cached copy, a failed check falls back to it inside the library, without retries
        return Path(
            hub.hf_hub_download(repo_id, filename, revision=revision, etag_timeout=_etag_timeout(hub))
        )
    except Exception as exc:  # the library's errors, and its HTTP client's for no network
        if isinstance(exc, hub.errors.EntryNotFoundError) and not isinstance(
            exc, hub.errors.LocalEntryNotFoundError
        ):
            return None
        if filename != CONFIG:
            return None  # a sidecar only refines the plan; config.json decides whether there is one
        raise _explain(hub, exc, repo_id, revision, unknown) from None


def _is_commit(revision: str | None) -> bool:
    return revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision) is not None


def _etag_timeout(hub: ModuleType) -> float:
    constants = hub.constants
    from_env = constants.HF_HUB_ETAG_TIMEOUT != constants.DEFAULT_ETAG_TIMEOUT
    return float(constants.HF_HUB_ETAG_TIMEOUT) if from_env else ETAG_TIMEOUT_S


def _explain(hub: ModuleType, exc: Exception, repo_id: str, revision: str | None, unknown: str) -> Exception:
    """One line for each way the Hub can fail, naming the model and what to do."""
    errors = hub.errors
    local = "a local config.json, or a folder holding one, also works"
    if isinstance(exc, errors.GatedRepoError):
        return UsageError(
            f"--model: {repo_id} is a gated model on the Hugging Face Hub: accept its terms at "
            f"https://huggingface.co/{repo_id}, then set HF_TOKEN or run `huggingface-cli login` "
            f"(`hf auth login`); {local}"
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return UsageError(f"--model: the Hugging Face repository {repo_id} has no revision {revision!r}")
    if isinstance(exc, errors.RepositoryNotFoundError) or _status(exc) == 401:
        return UsageError(
            f"{unknown}; nor is it a model on the Hugging Face Hub (a private one needs HF_TOKEN); {local}"
        )
    if isinstance(exc, errors.HFValidationError):
        return UsageError(f"{unknown}; {local}")
    status = _status(exc)
    if (
        isinstance(exc, errors.HfHubHTTPError)
        and status is not None
        and 400 <= status < 500
        and status != 429
    ):
        return UsageError(f"--model: the Hugging Face Hub refused {repo_id}: {_first_line(exc)}")
    cache = f"{repo_id} is not in the Hugging Face cache ({hub.constants.HF_HUB_CACHE})"
    if hub.constants.HF_HUB_OFFLINE or isinstance(exc, errors.OfflineModeIsEnabled):
        return UsageError(f"{unknown}; {cache} and HF_HUB_OFFLINE is set, so the Hub was not asked; {local}")
    return UsageError(
        f"{unknown}; {cache} and the Hub cannot be reached ({_first_line(exc)}); fetch it once online "
        f"(HF_HUB_OFFLINE=1 then reads only the cache); {local}"
    )


def _status(exc: Exception) -> int | None:
    response: Any = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
