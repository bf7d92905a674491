"""vLLM's own offline `LLM.generate`, one prompt at a time, greedy: the reference the
disaggregated path must match token for token. Run as a child process by the e2e tests
(`ReferenceRun`, started while their stack starts):

    python -m tests.e2e.reference_vllm MODEL_DIR PROMPTS_JSON OUT_JSON MAX_TOKENS [DTYPE [MAX_MODEL_LEN
        [LORA_DIR [LORA_PROMPTS]]]]

With LORA_DIR (a LoRA adapter of rank <= 8) the engine serves LoRA, and the output holds every
prompt's tokens from the base model, then those of the prompts LORA_PROMPTS names (their
comma-separated indexes; default: all) under the adapter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from libs.config.roles import Role
from libs.worker.config import WorkerConfig
from libs.worker.engine_args import engine_environment, engine_kwargs
from tests.e2e.harness import child_env


def offline_engine_environment(config: WorkerConfig) -> dict[str, str]:
    """The worker's engine environment for vLLM's offline `LLM` in this process, with V1
    multiprocessing off: the engine core and (on CPU, which then allows vLLM's uni executor) its
    model worker run here, so vLLM is imported once instead of in three processes in turn.
    Measured on this suite's 2-core machine: 26 CPU-s instead of 55 for one reference run over
    two prompts, with the same tokens. Only references run this way: the workers under test keep
    vLLM's own process layout."""
    return engine_environment(config, os.sched_getaffinity(0)) | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def main(
    model_dir: str,
    prompts_path: str,
    out_path: str,
    max_tokens: int,
    dtype: str = "auto",
    max_model_len: str = "",
    lora_dir: str = "",
    lora_prompts: str = "",
) -> None:
    config = WorkerConfig(
        role=Role.BOTH,
        model=str(model_dir),
        served_model_name="reference",
        kv_port=5799,
        dtype=dtype,
        max_model_len=int(max_model_len) if max_model_len else None,
        enable_lora=bool(lora_dir),
        max_lora_rank=8,
    )
    os.environ.update(offline_engine_environment(config))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    kwargs = engine_kwargs(config)
    kwargs.pop("disable_log_stats")
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    prompts = json.loads(Path(prompts_path).read_text())
    runs = [(ids, None) for ids in prompts]
    if lora_dir:
        adapter = LoRARequest("reference-lora", 1, lora_dir)
        chosen = [int(i) for i in lora_prompts.split(",")] if lora_prompts else range(len(prompts))
        runs += [(prompts[i], adapter) for i in chosen]
    outputs = []
    for ids, lora in runs:
        result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False, lora_request=lora)
        outputs.append(list(result[0].outputs[0].token_ids))
    Path(out_path).write_text(json.dumps(outputs))


class ReferenceRun:
    """This module as a child process over `prompts`, its log and output in `folder` under
    `name`. Started before a test's stack so that the two load at once: the stack's engines
    each start as a chain of processes importing vLLM in turn, which leaves a core idle."""

    def __init__(
        self, folder: Path, name: str, model_dir: Path, prompts: list[list[int]], max_tokens: int, *extra: str
    ) -> None:
        self._log = folder / f"{name}-reference.log"
        self._out = folder / f"{name}-reference.json"
        prompts_file = folder / f"{name}-prompts.json"
        prompts_file.write_text(json.dumps(prompts))
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.reference_vllm", str(model_dir), str(prompts_file),
                 str(self._out), str(max_tokens), *extra],
                stdout=log, stderr=subprocess.STDOUT, env=child_env(),
            )  # fmt: skip

    def outputs(self, timeout_s: float = 900) -> list[list[int]]:
        """Each prompt's generated token ids, in order; waits for the child to finish."""
        code = self._process.wait(timeout=timeout_s)
        assert code == 0, f"the vLLM reference exited with {code}: {self._log.read_text()[-3000:]}"
        return list(json.loads(self._out.read_text()))

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:])
