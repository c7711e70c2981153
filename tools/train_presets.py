"""Fit the trained presets' heads of every `presets` decisions card (issue 22); cached by checksum.

    .venv/bin/python -m tools.train_presets [--model-repository model_repository] [--data DIR] [--force]

The same step runs at the end of `sr-gateway models build`; the work is in sr_build/presets.py (the heads are
fitted on the encoder's embeddings of the `train` lines only, regularisation by cross-validation on them).
"""

from __future__ import annotations

from sr_build.presets import main

if __name__ == "__main__":
    main()
