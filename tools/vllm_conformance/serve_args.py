"""`vllm serve` arguments, as vLLM's own tests start their server, -> the Cleave gateway's flags.

vLLM's tests start `vllm serve MODEL ARGS` through their `RemoteOpenAIServer`; the conformance
runner starts a Cleave local stack instead, serving the default model under the name the
test uses. The flags Cleave has under vLLM's name pass as they are; settings that only tune a
GPU server or a model Cleave does not load are dropped, each named in `ignored` so a run says
what it did not honour.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# vLLM flags the gateway takes with the same name and meaning (a value follows each).
_SAME_WITH_VALUE = frozenset(
    {
        "--max-model-len",
        "--max-logprobs",
        "--tool-call-parser",
        "--chat-template",
        "--api-key",
        "--generation-config",
        "--served-model-name",
        "--structured-outputs-config",
        "--root-path",
        # The model's numerics: test_chat_echo and test_root_path serve float16, test_completion
        # float32; their sampled tests assert where a sample stops, which depends on it.
        "--dtype",
        # LoRA: the adapters the tests' fixtures fetch are the runner's (shim/tests_conftest.py).
        "--max-lora-rank",
        "--max-cpu-loras",
        "--max-loras",
    }
)
# vLLM flags the gateway takes with the same name, followed by one value or more (nargs="+").
_SAME_WITH_VALUES = frozenset({"--lora-modules"})
_SAME_SWITCHES = frozenset(
    {
        "--enable-auto-tool-choice",
        "--enable-force-include-usage",
        "--enable-prompt-tokens-details",
        "--return-tokens-as-token-ids",
        "--enable-lora",
    }
)
# vLLM's flag -> the gateway's, both taking a value. pd workers take the decode settings.
_RENAMED_WITH_VALUE = {"--max-num-seqs": "--decode-max-num-seqs"}
# Engine and server settings with no effect on what the API answers here (GPU memory, graph
# capture, the process layout, the listening port the runner picks itself).
_DROPPED_WITH_VALUE = frozenset(
    {
        "--gpu-memory-utilization",
        "--port",
        "--host",
        "--seed",
        "--load-format",
        "--max-num-batched-tokens",
        "--tensor-parallel-size",
        "--block-size",
    }
)
_DROPPED_SWITCHES = frozenset({"--enforce-eager", "--no-enable-prefix-caching", "--enable-prefix-caching"})


@dataclass
class Translation:
    flags: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # vLLM's flags not honoured, as given


def translate(vllm_args: Sequence[str], env: Mapping[str, str] | None = None) -> Translation:
    """The gateway flags for `vllm serve <model> vllm_args` (the model is the runner's)."""
    out = Translation()
    structured: dict[str, object] = {}
    pending = list(vllm_args)
    pending.reverse()  # popped from the end: the next argument is pending[-1]
    while pending:
        arg = pending.pop()
        name, has_inline, inline = arg.partition("=")
        takes_value = name in _SAME_WITH_VALUE or name in _RENAMED_WITH_VALUE or name in _DROPPED_WITH_VALUE
        takes_value |= name.startswith("--structured-outputs-config.")
        if not (takes_value or name in _SAME_SWITCHES or name in _DROPPED_SWITCHES):
            # Unknown here: with a value unless the next argument is another flag.
            takes_value = bool(has_inline) or bool(pending and not pending[-1].startswith("--"))
        if name in _SAME_WITH_VALUES:
            values = [inline] if has_inline else []
            while pending and not pending[-1].startswith("--"):
                values.append(pending.pop())
            out.flags += [name, *values]
            continue
        value = inline if has_inline else (pending.pop() if takes_value and pending else "")
        if name in _SAME_SWITCHES:
            out.flags.append(name)
        elif name in _SAME_WITH_VALUE:
            out.flags += [name, value]
        elif name in _RENAMED_WITH_VALUE:
            out.flags += [_RENAMED_WITH_VALUE[name], value]
        elif name.startswith("--structured-outputs-config."):
            # vLLM's dotted form of one JSON key, e.g. --structured-outputs-config.backend xgrammar.
            structured[name.split(".", 1)[1]] = value
        else:
            out.ignored.append(f"{name} {value}" if takes_value else name)
    if structured:
        out.flags += ["--structured-outputs-config", json.dumps(structured)]
    if env and "VLLM_API_KEY" in env and "--api-key" not in out.flags:
        out.flags += ["--api-key", env["VLLM_API_KEY"]]
    return out


# The control run (vllm_control.py) gives vLLM the test's own arguments but the listening
# address, which the runner picks itself.
_CONTROL_DROPPED_WITH_VALUE = frozenset({"--port", "--host"})
_CONTROL_DROPPED_SWITCHES: frozenset[str] = frozenset()


def control_args(vllm_args: Sequence[str]) -> list[str]:
    """The test's serve arguments without the listening-address ones."""
    kept: list[str] = []
    skip_value = False
    for arg in vllm_args:
        if skip_value:
            skip_value = False
            continue
        name, has_inline, _ = arg.partition("=")
        if name in _CONTROL_DROPPED_SWITCHES:
            continue
        if name in _CONTROL_DROPPED_WITH_VALUE:
            skip_value = not has_inline
            continue
        kept.append(arg)
    return kept
