"""The tiny demo models a stack bench needs, built once or copied from a prebuilt folder."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from rich.console import Console

PREBUILT = Path(os.environ.get("ROSE_PREBUILT_MODELS", "/tmp/rd/models"))  # a copy is faster than a build


def ensure_models(console: Console) -> None:
    """The demo's policy and reward models under the data dir: kept, copied from PREBUILT, or built."""
    from core.config import ModelsConfig, data_dir
    from rose.models.build import build_models

    if (ModelsConfig().policy_path() / "config.json").is_file():
        return
    if (PREBUILT / "policy" / "config.json").is_file():
        shutil.copytree(PREBUILT, data_dir() / "models", dirs_exist_ok=True)
    else:
        console.print("building the tiny models (once)")
        build_models(ModelsConfig())
