"""Mock profiles: the JSON files under libs/mockengine/profiles/ that say which model the
mock pretends to run, on what, and how long its steps take.

A profile holds the step-time coefficients (the formula is fixed in timing.py and each file
repeats it; a file whose text differs is refused, so no result silently used another
formula), the model's KV facts, the KV transfer bandwidth and latency for handoffs, the
worker start-up time, scheduler defaults, and where its numbers come from (`sources`,
`calibration`; `calibrated` false marks placeholder coefficients).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libs.mockengine.timing import FORMULA, StepCoefficients

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


@dataclass(frozen=True)
class ModelFacts:
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int
    eos_token_id: int
    kv_cache_dtype: str  # a libs.kvlayout name: bfloat16, float16, float32, fp8...
    kv_bytes_per_element: int
    block_size: int

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element

    def kv_bytes_per_block(self, block_size: int | None = None) -> int:
        return self.kv_bytes_per_token() * (block_size or self.block_size)


@dataclass(frozen=True)
class KvTransfer:
    bandwidth_bytes_per_s: float
    latency_s: float

    def seconds(self, num_bytes: int) -> float:
        """Unscaled time to move `num_bytes` of KV between two engines."""
        if self.bandwidth_bytes_per_s <= 0:
            return self.latency_s
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class Profile:
    name: str
    coefficients: StepCoefficients
    calibrated: bool
    model: ModelFacts
    kv_transfer: KvTransfer
    startup_s: float
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_bytes: int
    sources: str
    calibration: str
    # Coefficients measured with the engine on this many cores (a CPU engine's step time depends
    # on its cores; `coefficients` is the default where none matches).
    by_cores: dict[int, StepCoefficients] = field(default_factory=dict)

    def coefficients_for(self, cores: int | None) -> StepCoefficients:
        """The coefficients measured on `cores`, else on the most cores below it, else the
        default ones."""
        if cores is None or not self.by_cores:
            return self.coefficients
        fitting = [n for n in self.by_cores if n <= cores]
        return self.by_cores[max(fitting)] if fitting else self.coefficients


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (a file under libs/mockengine/profiles/) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.json"))
        raise ValueError(
            f"no mock profile {name_or_path!r} (known: {known}, or a path to a .json file)"
        ) from None
    return profile_from_dict(data, source=str(path))


def profile_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> Profile:
    try:
        if data["formula"] != FORMULA:
            raise ValueError(
                f"mock profile {source}: its formula differs from the mock's (libs/mockengine/timing.py);"
                " the formula is fixed, only coefficients may change"
            )
        coefficients = data["coefficients"]
        model = data["model"]
        transfer = data["kv_transfer"]
        defaults = data["scheduler_defaults"]
        return Profile(
            name=str(data["name"]),
            coefficients=StepCoefficients(
                **{k: float(v) for k, v in coefficients.items() if k != "calibrated"}
            ),
            calibrated=bool(coefficients.get("calibrated", True)),
            model=ModelFacts(**model),
            kv_transfer=KvTransfer(
                bandwidth_bytes_per_s=float(transfer["bandwidth_bytes_per_s"]),
                latency_s=float(transfer["latency_s"]),
            ),
            startup_s=float(data["startup_s"]),
            max_num_seqs=int(defaults["max_num_seqs"]),
            max_num_batched_tokens=int(defaults["max_num_batched_tokens"]),
            kv_cache_bytes=int(defaults["kv_cache_bytes"]),
            sources=_text(data["sources"]),
            calibration=_text(data["calibration"]),
            by_cores={
                int(cores): StepCoefficients(**{k: float(v) for k, v in values.items() if k != "calibrated"})
                for cores, values in data.get("coefficients_by_cores", {}).items()
            },
        )
    except (KeyError, TypeError) as error:
        raise ValueError(f"mock profile {source} is malformed: {error!r}") from None


def _text(value: Any) -> str:
    """A text field, written in the file as one string or as a list of lines."""
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)
