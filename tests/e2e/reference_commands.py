"""qaic_disagg's documented launch commands, as a user would paste them into Cleave."""

from __future__ import annotations

# The prefill/decode command, verbatim from the reference's Disaggregated Serving page except
# --model and the device groups; its ports too. --max-model-len 11264 is beyond SmolLM2's 8192:
# the workers use 8192. (Its draft-model command is in test_speculative.py.)
REFERENCE_PD_COMMAND = (
    "--model", "smollm2",
    "--prefill-port", "9900",
    "--prefill-device-group", "0",
    "--decode-port", "9800",
    "--decode-device-group", "1",
    "--port", "8000",
    "--prefill-max-num-seqs", "1",
    "--decode-max-num-seqs", "1",
    "--prefill-max-seq-len-to-capture", "256",
    "--decode-max-seq-len-to-capture", "256",
    "--max-model-len", "11264",
    "--prefill-override-qaic-config", "split_retained_state_io:True mxfp6_matmul:True",
    "--decode-override-qaic-config", "split_retained_state_io:True mxfp6_matmul:True",
    "--generation-config", "vllm",
    "--kv-cache-dtype", "mxint8", "-v", "-v", "-v",
)  # fmt: skip
