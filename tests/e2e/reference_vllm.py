"""vLLM's own offline `LLM.generate`, one prompt at a time, greedy: the reference the
disaggregated path must match token for token. Run as a child process by the e2e tests:

    python -m tests.e2e.reference_vllm MODEL_DIR PROMPTS_JSON OUT_JSON MAX_TOKENS [DTYPE [MAX_MODEL_LEN]]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from libs.config.roles import Role
from libs.worker.config import WorkerConfig
from libs.worker.engine_args import engine_environment, engine_kwargs


def main(
    model_dir: str,
    prompts_path: str,
    out_path: str,
    max_tokens: int,
    dtype: str = "auto",
    max_model_len: str = "",
) -> None:
    config = WorkerConfig(
        role=Role.BOTH,
        model=str(model_dir),
        served_model_name="reference",
        kv_port=5799,
        dtype=dtype,
        max_model_len=int(max_model_len) if max_model_len else None,
    )
    os.environ.update(engine_environment(config, os.sched_getaffinity(0)))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = engine_kwargs(config)
    kwargs.pop("disable_log_stats")
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    outputs = []
    for ids in json.loads(Path(prompts_path).read_text()):
        result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
        outputs.append(list(result[0].outputs[0].token_ids))
    Path(out_path).write_text(json.dumps(outputs))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:])
