"""`--speculative-config`: qaic_disagg's two JSON forms, checked once, translated to vLLM's.

qaic_disagg documents two forms for its decode workers:

    {"method": "ngram", "num_speculative_tokens": 5}
    {"speculative_model": "<model>", "num_speculative_tokens": 3,
     "draft_override_qaic_config": {"device_group": [0], "num_cores": 6}}

The second is the vLLM-0.x spelling of its Cloud AI fork; current vLLM (SpeculativeConfig)
calls the draft `model` and refuses the other keys. `parse_speculative_config` checks the
JSON at a process's edge (one ConfigError naming the key); `vllm_speculative_kwargs` gives
vLLM's form; `draft_override_qaic_config` is not vLLM's and travels to the platform plugin in
`additional_config` (see engine_args.py).

Where the draft runs: vLLM runs the draft model inside the decode engine, in the same process
and on the same devices as the target (vLLM has no per-draft placement on CPU or CUDA). On
CPU it therefore computes on the decode worker's `--device-group` cores; the draft's own
`device_group` is checked here and handed to the Cloud AI plugin, which places the draft on
those device ids, and has no effect elsewhere.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from typing import Any

from cleave.worker.v1 import worker_pb2
from libs.config.errors import ConfigError
from libs.config.values import parse_device_group

FLAG = "--speculative-config"


class Method(enum.Enum):
    NGRAM = "ngram"  # drafts by matching the sequence's own earlier n-grams; no model
    DRAFT_MODEL = "draft_model"  # a smaller model with the target's vocabulary drafts


# Accepted spellings of the method, including vLLM 0.x's `"speculative_model": "[ngram]"`.
_METHODS = {"ngram": Method.NGRAM, "[ngram]": Method.NGRAM, "draft_model": Method.DRAFT_MODEL}
# qaic_disagg / vLLM 0.x names of the n-gram window -> vLLM's current names.
_LOOKUP_ALIASES = {
    "ngram_prompt_lookup_max": "prompt_lookup_max",
    "ngram_prompt_lookup_min": "prompt_lookup_min",
}
_KEYS = (
    "method",
    "num_speculative_tokens",
    "speculative_model",
    "model",
    "prompt_lookup_min",
    "prompt_lookup_max",
    *_LOOKUP_ALIASES,
    "draft_override_qaic_config",
)


@dataclass(frozen=True)
class SpeculativeSpec:
    method: Method
    num_speculative_tokens: int
    # As the user wrote it until the entry point resolves it like --model (a folder path).
    draft_model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    # The draft's device ids (Cloud AI); on CPU and CUDA the draft shares the decode engine's.
    draft_device_group: tuple[int, ...] = ()
    # Everything in draft_override_qaic_config, device_group included, for the QAIC plugin.
    draft_override_qaic_config: dict[str, Any] | None = None

    def with_draft_model(self, path: str) -> SpeculativeSpec:
        return replace(self, draft_model=path)

    def to_json(self) -> str:
        """The qaic_disagg form again (for a worker's command line after resolution)."""
        document: dict[str, Any] = {"num_speculative_tokens": self.num_speculative_tokens}
        if self.method is Method.NGRAM:
            document["method"] = "ngram"
        else:
            document["speculative_model"] = self.draft_model
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, key) is not None:
                document[key] = getattr(self, key)
        if self.draft_override_qaic_config is not None:
            document["draft_override_qaic_config"] = self.draft_override_qaic_config
        return json.dumps(document, separators=(",", ":"))


def vllm_speculative_kwargs(spec: SpeculativeSpec) -> dict[str, Any]:
    """vLLM's SpeculativeConfig fields (engine argument `speculative_config`)."""
    kwargs: dict[str, Any] = {
        "method": spec.method.value,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.method is Method.DRAFT_MODEL:
        # The method is explicit: vLLM otherwise guesses it from the model's name and type.
        kwargs["model"] = spec.draft_model
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if getattr(spec, key) is not None:
            kwargs[key] = getattr(spec, key)
    return kwargs


def parse_speculative_config(text: str, flag: str = FLAG) -> SpeculativeSpec:
    """The JSON of `flag`, checked: one ConfigError naming the first bad key."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(flag, text, f"a JSON object ({error.msg} at character {error.pos})") from None
    if not isinstance(document, dict):
        raise ConfigError(flag, text, 'a JSON object, e.g. {"method": "ngram", "num_speculative_tokens": 5}')
    unknown = [key for key in document if key not in _KEYS]
    if unknown:
        raise ConfigError(
            _key(flag, unknown[0]), document[unknown[0]], f"one of the known keys {', '.join(_KEYS)}"
        )
    for alias, name in _LOOKUP_ALIASES.items():
        if alias in document:
            if name in document:
                raise ConfigError(_key(flag, alias), document[alias], f"not both {alias!r} and {name!r}")
            document[name] = document.pop(alias)

    if "speculative_model" in document and "model" in document:
        raise ConfigError(_key(flag, "model"), document["model"], "not both 'model' and 'speculative_model'")
    model_key = "speculative_model" if "speculative_model" in document else "model"
    model = document.get(model_key)
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(_key(flag, model_key), model, "a model name or path")
    method = _method(flag, text, document, model, model_key)
    if method is Method.NGRAM:
        model = None
    elif model is None:
        raise ConfigError(
            flag, text, "the key 'speculative_model' too (the draft model of method 'draft_model')"
        )

    tokens: Any = document.get("num_speculative_tokens")
    if "num_speculative_tokens" not in document:
        raise ConfigError(flag, text, "the key 'num_speculative_tokens' too (a positive integer)")
    lookup: dict[str, Any] = {key: document.get(key) for key in ("prompt_lookup_min", "prompt_lookup_max")}
    for key, value in [("num_speculative_tokens", tokens), *lookup.items()]:
        if value is not None and not _positive_int(value):
            raise ConfigError(_key(flag, key), value, "a positive integer")
    if method is not Method.NGRAM:
        for key, value in lookup.items():
            if value is not None:
                raise ConfigError(
                    _key(flag, key), value, "unset: the n-gram window applies to method 'ngram' only"
                )
    elif None not in lookup.values() and lookup["prompt_lookup_min"] > lookup["prompt_lookup_max"]:
        raise ConfigError(
            _key(flag, "prompt_lookup_min"), lookup["prompt_lookup_min"], "at most prompt_lookup_max"
        )

    overrides = document.get("draft_override_qaic_config")
    device_group: tuple[int, ...] = ()
    if overrides is not None:
        if method is Method.NGRAM:
            raise ConfigError(
                _key(flag, "draft_override_qaic_config"), overrides, "unset: n-gram has no draft model"
            )
        if not isinstance(overrides, dict):
            raise ConfigError(
                _key(flag, "draft_override_qaic_config"), overrides, 'a JSON object, e.g. {"num_cores": 6}'
            )
        device_group = _device_group(flag, overrides.get("device_group"))
    return SpeculativeSpec(
        method=method,
        num_speculative_tokens=tokens,
        draft_model=model,
        prompt_lookup_min=lookup["prompt_lookup_min"],
        prompt_lookup_max=lookup["prompt_lookup_max"],
        draft_device_group=device_group,
        draft_override_qaic_config=overrides,
    )


def _method(flag: str, text: str, document: dict[str, Any], model: str | None, model_key: str) -> Method:
    written = document.get("method")
    if model in ("ngram", "[ngram]"):  # vLLM 0.x: "speculative_model": "[ngram]"
        if written not in (None, "ngram"):
            raise ConfigError(_key(flag, "method"), written, f"'ngram' (the {model_key} is {model!r})")
        return Method.NGRAM
    if written is None:
        if model is None:
            raise ConfigError(
                flag, text, "the key 'method' (\"ngram\") or 'speculative_model' (a draft model)"
            )
        return Method.DRAFT_MODEL
    if written not in _METHODS:
        raise ConfigError(_key(flag, "method"), written, "'ngram' or 'draft_model'")
    method = _METHODS[written]
    if method is Method.NGRAM and model is not None:
        raise ConfigError(_key(flag, model_key), model, "unset: method 'ngram' uses no draft model")
    return method


def _device_group(flag: str, value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # the --device-group syntax: '0..3', '0,2' or '1'
        return parse_device_group(_key(flag, "draft_override_qaic_config.device_group"), value)
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(ids, list) or not ids or not all(_non_negative_int(i) for i in ids):
        raise ConfigError(
            _key(flag, "draft_override_qaic_config.device_group"), value, "device ids: [0], [0, 1] or '0..3'"
        )
    return tuple(ids)


def _key(flag: str, key: str) -> str:
    return f"{flag} key {key!r}"


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def spec_decode_stats(counts: dict[str, int]) -> worker_pb2.SpecDecodeStats:
    """WorkerStats.spec_decode from the engine's cumulative counts, with the two ratios."""
    drafts = int(counts.get("drafts", 0))
    draft_tokens = int(counts.get("draft_tokens", 0))
    accepted = int(counts.get("accepted_tokens", 0))
    return worker_pb2.SpecDecodeStats(
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens else 0.0,
        mean_accepted_length=1 + accepted / drafts if drafts else 0.0,
    )
