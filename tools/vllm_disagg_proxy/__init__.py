"""A minimal OpenAI-compatible proxy for vLLM's disaggregated prefill/decode (NixlConnector)."""
