"""Turn what a user asked for (a name or a local path) into a loadable HF-format folder."""

from pathlib import Path

import structlog

from libs.models import gguf_cache
from libs.models.builtin import BUILTIN_MODELS
from libs.models.errors import ModelNotFoundError
from libs.models.spec import ModelOrigin, ResolvedModel

log = structlog.get_logger(__name__)

GGUF_MAGIC = b"GGUF"


def resolve_model(
    model: str,
    cache_dir: Path,
    progress: bool = True,
    hub_cache_dir: Path | None = None,
    allow_download: bool = False,
) -> ResolvedModel:
    """Resolve `model` to a local Hugging Face-format folder, converting GGUF files once.

    `model` is, checked in this order:
      - a built-in name (``"smollm2"``, the default model): its packaged GGUF is converted;
        to use a local folder that happens to share the name, pass it as ``./smollm2``;
      - a local HF folder containing config.json: used as is;
      - a local GGUF file: converted into a bf16 safetensors folder under `cache_dir`,
        reused on later calls;
      - a hub id (``org/name``) already in the local Hugging Face cache (`hub_cache_dir`, by
        default huggingface_hub's own: ``HF_HUB_CACHE`` or ``HF_HOME``/hub): its snapshot.
    With `allow_download` a hub id missing from that cache is downloaded into it (huggingface_hub
    does the work and honours ``HF_HUB_OFFLINE`` and ``HF_TOKEN``); without it nothing ever
    goes online. Anything else raises ModelNotFoundError.
    `progress` shows a progress bar on stderr while converting.
    """
    builtin = BUILTIN_MODELS.get(model)
    if builtin is not None:
        gguf_path = builtin.locate_gguf()
        folder = gguf_cache.ensure_converted(gguf_path, cache_dir, progress)
        return _resolved(model, folder, builtin.name, ModelOrigin.BUILTIN, gguf_path)

    if not model.strip():
        raise _not_found(model, "the name is empty")
    candidate = Path(model).expanduser().resolve()
    if candidate.is_dir():
        if not (candidate / "config.json").is_file():
            raise _not_found(model, f"the folder {candidate} has no config.json")
        return _resolved(model, candidate, candidate.name, ModelOrigin.HF_FOLDER, candidate)
    if candidate.is_file():
        if not _has_gguf_magic(candidate):
            problem = (
                f"the file {candidate} does not start with the GGUF magic bytes (corrupt or not GGUF)"
                if candidate.suffix == ".gguf"
                else f"the file {candidate} is not a GGUF file (for a Hugging Face model pass its folder)"
            )
            raise _not_found(model, problem)
        folder = gguf_cache.ensure_converted(candidate, cache_dir, progress)
        return _resolved(model, folder, candidate.stem, ModelOrigin.GGUF_FILE, candidate)

    problem = f"no file or folder exists at {candidate}"
    if _looks_like_hub_id(model):
        snapshot = _hub_snapshot(model, hub_cache_dir)
        if snapshot is not None:
            return _resolved(model, snapshot, model, ModelOrigin.HUB_CACHE, snapshot)
        cache = hub_cache_dir or "HF_HUB_CACHE / HF_HOME"
        if allow_download:
            snapshot = _hub_download(model, hub_cache_dir)
            return _resolved(model, snapshot, model, ModelOrigin.HUB_CACHE, snapshot)
        problem += (
            f" and the hub id is not in the local Hugging Face cache ({cache}); download it there "
            "first, or pass --allow-model-download"
        )
    raise _not_found(model, problem)


def _hub_download(model: str, hub_cache_dir: Path | None) -> Path:
    """Downloads a hub id into the Hugging Face cache; any failure (no network, unknown or
    gated repository, HF_HUB_OFFLINE) is a ModelNotFoundError that says what went wrong."""
    from huggingface_hub import snapshot_download

    log.info("models.downloading", model=model, cache=str(hub_cache_dir or "default"))
    try:
        folder = Path(snapshot_download(model, cache_dir=hub_cache_dir))
    except Exception as error:  # every cause (network, gated repo, offline mode) is reported alike
        raise _not_found(
            model, f"downloading it from the hub failed ({type(error).__name__}: {error})"
        ) from error
    if not (folder / "config.json").is_file():
        raise _not_found(model, f"the downloaded snapshot {folder} has no config.json")
    return folder


def _hub_snapshot(model: str, hub_cache_dir: Path | None) -> Path | None:
    """The cached snapshot folder of a hub id, offline (huggingface_hub never goes online
    with local_files_only); None when it is not cached or lacks config.json."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(model, cache_dir=hub_cache_dir, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
    return folder if (folder / "config.json").is_file() else None


def _resolved(
    requested: str, folder: Path, served_name: str, origin: ModelOrigin, source: Path
) -> ResolvedModel:
    resolved = ResolvedModel(path=folder, served_name=served_name, origin=origin, source=source)
    log.info(
        "models.resolved",
        requested=requested,
        path=str(folder),
        served_name=served_name,
        origin=origin.value,
        source=str(source),
    )
    return resolved


def _not_found(model: str, problem: str) -> ModelNotFoundError:
    names = ", ".join(repr(name) for name in sorted(BUILTIN_MODELS))
    return ModelNotFoundError(
        f"Cannot use model {model!r}: {problem}. Expected a built-in model name ({names}), "
        "a local Hugging Face model folder containing config.json (with safetensors weights and "
        "tokenizer files), a local .gguf file, or a hub id already in the local Hugging Face "
        "cache (downloaded only with --allow-model-download)."
    )


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def _looks_like_hub_id(model: str) -> bool:
    # "org/name" with no other path syntax, e.g. "HuggingFaceTB/SmolLM2-135M-Instruct".
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~"))
