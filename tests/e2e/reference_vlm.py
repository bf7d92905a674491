"""vLLM's own offline `LLM.generate` with the images themselves (the engine runs the vision
tower: vLLM's in-engine path), greedy: the reference the encoder modes must match token for
token. Run as a child process by the e2e tests:

    python -m tests.e2e.reference_vlm MODEL_DIR CASES_JSON OUT_JSON MAX_TOKENS

CASES_JSON: [{"prompt_token_ids": [...], "images": ["<base64 file>", ...]}, ...]
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
from pathlib import Path


def main(model_dir: str, cases_path: str, out_path: str, max_tokens: int) -> None:
    from libs.config.roles import Role
    from libs.worker.config import WorkerConfig
    from libs.worker.engine_args import engine_kwargs
    from tests.e2e.reference_vllm import offline_engine_environment

    config = WorkerConfig(
        role=Role.BOTH, model=model_dir, served_model_name="reference", kv_port=5798, dtype="float32"
    )
    os.environ.update(offline_engine_environment(config))
    from PIL import Image
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = engine_kwargs(config)
    kwargs.pop("disable_log_stats")
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False)
    outputs = []
    for case in json.loads(Path(cases_path).read_text()):
        images = [Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB") for data in case["images"]]
        prompt = TokensPrompt(prompt_token_ids=case["prompt_token_ids"], multi_modal_data={"image": images})
        result = llm.generate([prompt], params, use_tqdm=False)
        outputs.append(list(result[0].outputs[0].token_ids))
    Path(out_path).write_text(json.dumps(outputs))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
