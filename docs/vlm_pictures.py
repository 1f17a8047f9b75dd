"""Regenerate the pictures of docs/guide/vlm.md: docs/img/vlm_strip.png and docs/img/vlm_page.png.

What it does, as a user would: a tiny LLaVA 1.5 with random weights (``tests/vlm/tiny_llava.py``,
built from code) saved with ``save_pretrained``, then ``camkit explain`` on scikit-image's
astronaut photograph with ``--model hf:FOLDER --prompt ...``; the strip PNG is copied and the HTML
page is screenshot in headless Chromium (``--chromium PATH``, default /usr/bin/chromium) with one
word pointed at (``page.html#t=N``). A few seconds on a CPU. The maps of a random model show how
the pictures read, not where a trained model looks.

    python docs/vlm_pictures.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--word", type=int, default=2, help="the word pointed at in the page's screenshot")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests" / "vlm"))
    import tiny_llava
    from skimage import data

    import camkit
    from camkit.cli import main as camkit_main

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, processor = tiny_llava.build()
        model.save_pretrained(root / "llava")
        processor.save_pretrained(root / "llava")
        camkit.save_png(root / "astronaut.png", data.astronaut())
        code = camkit_main(["explain", str(root / "astronaut.png"), "--model", f"hf:{root / 'llava'}", "--prompt",
                            "what is in the picture ?", "--max-new-tokens", "6", "--out", str(root / "out")])  # fmt: skip
        if code != 0:
            raise SystemExit(f"camkit explain failed with exit code {code}")
        (entry,) = json.loads((root / "out" / "manifest.json").read_text())["images"]
        shutil.copyfile(root / "out" / entry["strip"], HERE / "img" / "vlm_strip.png")
        page = (root / "out" / entry["page"]).resolve()
        subprocess.run([args.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=900,720", f"--screenshot={HERE / 'img' / 'vlm_page.png'}",
                        f"{page.as_uri()}#t={args.word}"], check=True, capture_output=True)  # fmt: skip
    print("wrote docs/img/vlm_strip.png and docs/img/vlm_page.png")


if __name__ == "__main__":
    main()
