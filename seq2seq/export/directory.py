"""An output directory that appears whole or not at all.

An export is several files (weights, config, tokenizer, ...). They are written into a fresh temp
directory beside the target and renamed into place at the end, so an error (or Ctrl-C) never
leaves a partial model directory under the final name; an existing target is refused unless
``force``, and then replaced only after the new one is complete.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import UserError
from ..io_utils import current_umask, temp_path_beside


@contextmanager
def atomic_directory(path: str | Path, force: bool = False, flag: str = "OUT") -> Iterator[Path]:
    """Yield an empty temp directory that becomes ``path`` if the block succeeds."""
    path = Path(path)
    if path.exists() and not force:
        raise UserError(f"{flag} {path} already exists; choose a new directory or pass --force to replace it")
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a directory; choose another path")
    tmp = temp_path_beside(path)
    tmp.mkdir(mode=0o777 & ~current_umask())
    try:
        yield tmp
        if path.exists():  # --force: the old directory goes only once the new one is complete
            old = temp_path_beside(path)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
