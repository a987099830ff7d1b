"""Files a user names on the command line (a config, a topology, a trace, a script), checked
before anything is read or spawned, and the `--out` folder a command writes into.

One place decides what such a file must be: an existing regular file (a directory, a pipe or a
device is refused by name: a FIFO would block the read forever, /dev/zero fill the memory),
of a sane size, and UTF-8 text where it is read as text. Each refusal is one line that names
the option the file came from.
"""

from __future__ import annotations

import importlib.util
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hetsync.errors import ConfigError

__all__ = ["TEXT_LIMIT", "check_python_script", "check_user_file", "out_folder",
           "read_user_text"]

#: The largest text file read whole (a slowdown trace of 1000 workers' 10,000 iterations is
#: about 150 MB).
TEXT_LIMIT = 512 * 2**20


def check_user_file(path: str | Path, what: str,
                    error: type[ConfigError] = ConfigError) -> Path:
    """`path` as a Path if it is an existing regular file; else `error`, naming `what`."""
    if not str(path).strip():  # (Path("") is ".")
        raise error(f"{what}: no file given")
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise error(f"{what} {path} is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise error(f"{what} {path} is not a regular file (a pipe, socket or device)")
    return path


def read_user_text(path: str | Path, what: str, error: type[ConfigError] = ConfigError,
                   limit: int = TEXT_LIMIT) -> str:
    """The whole text of a user's file, checked as `check_user_file` does; `error` naming
    `what` if it is larger than `limit` bytes, unreadable or not UTF-8."""
    path = check_user_file(path, what, error)
    size = path.stat().st_size
    if size > limit:
        raise error(f"{what} {path} is {size / 2**20:.0f} MiB, more than the "
                    f"{limit / 2**20:.0f} MiB such a file may hold")
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not a text file (not UTF-8)") from None


def check_python_script(path: str | Path, what: str = "script") -> Path:
    """`path` if Python can run it as a script: a text file that compiles (a SyntaxError is
    named here, once, not by every worker after they all spawned), or a zip application.
    A binary, a folder or a file of another language: ConfigError naming `what`."""
    path = check_user_file(path, what)
    if zipfile.is_zipfile(path):  # `python app.pyz` runs its __main__.py
        return path
    size = path.stat().st_size
    if size > TEXT_LIMIT:
        raise ConfigError(f"{what} {path} is {size / 2**20:.0f} MiB: not a Python script")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if b"\0" in data:
        raise ConfigError(f"{what} {path} is not a Python script (a binary file)")
    try:
        compile(importlib.util.decode_source(data), str(path), "exec", dont_inherit=True)
    except (UnicodeDecodeError, LookupError):
        raise ConfigError(f"{what} {path} is not a Python script (not text in its "
                          f"encoding)") from None
    except SyntaxError as exc:
        raise ConfigError(f"{what} {path} is not valid Python: {exc.msg} (line "
                          f"{exc.lineno})") from None
    return path


@contextmanager
def out_folder(out: Path) -> Iterator[Path]:
    """Create `out` and yield it; an OSError while writing into it (an --out that is a file,
    under a file, read-only or on a full disk) becomes one line naming --out (ConfigError)
    instead of a traceback: every command's --out (a run's lock, a report, a suite, a demo)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        yield out
    except OSError as error:
        raise ConfigError(f"--out {out} cannot be written: {error.strerror or error}") from None
