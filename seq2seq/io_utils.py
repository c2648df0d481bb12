"""Small I/O helpers: the one atomic writer, temp names beside a target, chunked line streams and
the one markdown table renderer and the one way to write a count with its noun (``counted``).

Every file the toolkit writes goes through a temp file in the target's directory, flushed to the
disk (``fsync``) and then renamed over the target (``os.replace``, atomic on POSIX; the directory is
synced after it), so an error or a crash never leaves a half-written file under the final name.
The published file gets the permissions a plain ``open(path, "w")`` would give: 0666 less the
process umask (``tempfile.mkstemp`` alone would leave it private, 0600).
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
import uuid
from contextlib import contextmanager, nullcontext
from itertools import islice
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence, TypeVar

from .errors import OutputError, UserError

T = TypeVar("T")

#: The operating-system failures a user can cause and fix, as they read in a message.
FIXABLE_ERRNOS = {
    errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of the path is a file, not a directory", errno.EISDIR: "the path is a directory",
    errno.EEXIST: "a part of the path is a file, not a directory",
    errno.EMFILE: "too many open files", errno.ENFILE: "too many open files in the system",
    errno.ENAMETOOLONG: "file name too long",
    errno.EIO: "input/output error (the disk or its file system failed; check it)",
}


def output_error(exc: OSError, doing: str, survived: str = "") -> OutputError | None:
    """``exc`` as the message "REASON DOING[; SURVIVED]" (e.g. "no space left on device writing RUN/last.pt;
    RUN/best.pt (step 40) is intact") when a user can fix its cause, else None (a bug: let it show)."""
    reason = FIXABLE_ERRNOS.get(exc.errno)
    if reason is None:
        return None
    return OutputError(f"{reason} {doing}" + (f"; {survived}" if survived else ""))


def make_directory(path: Path, doing: str = "", survived: str = "") -> None:
    """``path.mkdir(parents=True, exist_ok=True)``; a refusal the user can fix is an ``OutputError``
    saying what was being done (default: "creating the directory PATH")."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(exc, doing or f"creating the directory {path}", survived) or exc from None


def current_umask() -> int:
    """The process umask (reading it means setting it; it is restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_path_beside(path: Path) -> Path:
    """A fresh temp name in ``path``'s directory (so ``os.replace`` is an atomic rename); the
    directory is created. For writers that open the file themselves (matplotlib, zip archives),
    which then get ordinary permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextmanager
def atomic_output(path: str | Path | None, mode: str = "w") -> Iterator[IO]:
    """Yield a file that appears at ``path`` only if the block succeeds; '-' or None is stdout."""
    if path in (None, "-"):
        yield sys.stdout if "b" not in mode else sys.stdout.buffer
        return
    path = Path(path)
    make_directory(path.parent, f"writing {path} (cannot create its directory {path.parent})")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise output_error(exc, f"writing {path}", _what_survived(path)) or exc from None
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # what open(path, "w") gives, not mkstemp's 0600
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            _name_write_errors(handle, tmp)
            yield handle
            try:
                handle.flush()
                os.fsync(handle.fileno())  # the data is on the disk before the name points at it
            except OSError as exc:
                exc.filename = exc.filename or tmp
                raise
        os.replace(tmp, path)
        sync_directory(path.parent)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        ours = exc.filename in (None, tmp, str(path))  # not an error about another file read in the block
        raise (output_error(exc, f"writing {path}", _what_survived(path)) if ours else None) or exc from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _name_write_errors(handle: IO, tmp: str) -> None:
    """Make an ``OSError`` from writing to ``handle`` carry ``tmp`` as its file name, so that when
    atomic writes are nested (a job writing several outputs at once) the one whose write failed claims
    the error, not the innermost."""
    for name in ("write", "writelines"):
        method = getattr(handle, name)

        def named(data, _method=method):
            try:
                return _method(data)
            except OSError as exc:
                exc.filename = exc.filename or tmp
                raise

        setattr(handle, name, named)


def sync_directory(directory: Path) -> None:
    """fsync a directory, so that a rename in it survives a crash (best effort: some file systems
    and platforms cannot open or sync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _what_survived(path: Path) -> str:
    return (f"nothing was written; the earlier {path} is intact" if path.exists()
            else f"nothing was written to {path}")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (``atomic_output``)."""
    with atomic_output(path, "wb") as handle:
        handle.write(data)


def counted(count: int | None, noun: str, nouns: str | None = None) -> str:
    """``count`` with its noun in the right number: "1 line", "2 lines", "12,000 lines" (``nouns``: an
    irregular plural, "hypotheses"); a count that is not a number (a key missing from an old config) as it is."""
    number = f"{count:,}" if isinstance(count, int) else str(count)
    return f"{number} {noun if count == 1 else nouns or noun + 's'}"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table (no trailing newline); cells are written with ``str``."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def display_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies inside it (records and reports written
    in a repository then hold no machine-specific absolute paths), else as given."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of at most ``size`` items."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def check_report_dir(out: Path, flag: str, kind: str) -> None:
    """``flag``'s directory ``out`` may be new, empty, or an earlier ``kind`` report (it holds
    ``report.json``; replaced); anything else is refused, so no one's files are overwritten."""
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out} is a file; give a directory for the report")
    if out.is_dir() and any(out.iterdir()) and not (out / "report.json").is_file():
        raise UserError(f"{flag} {out} exists and is not a {kind} report (no report.json); "
                        "choose a new directory or empty it")


@contextmanager
def atomic_directory(path: str | Path, force: bool = False, flag: str = "OUT") -> Iterator[Path]:
    """Yield an empty temp directory beside ``path`` that becomes ``path`` if the block succeeds and is
    removed if it fails (an error or Ctrl-C), so a directory of several files (an export, a report)
    appears whole or not at all. An existing ``path`` is refused unless ``force``, and then replaced
    only once the new one is complete."""
    path = Path(path)
    if path.exists() and not force:
        raise UserError(f"{flag} {path} already exists; choose a new directory or pass --force to replace it")
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a directory; choose another path")
    tmp = temp_path_beside(path)
    make_directory(path.parent, f"writing {path} (cannot create its directory {path.parent})")
    try:
        tmp.mkdir(mode=0o777 & ~current_umask())
    except OSError as exc:
        raise output_error(exc, f"writing {path}") or exc from None
    try:
        yield tmp
        if path.exists():  # --force: the old directory goes only once the new one is complete
            old = temp_path_beside(path)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise output_error(exc, f"writing {path}", _what_survived(path)) or exc from None
    except OutputError as exc:  # a file inside: named by the directory's final path, not the temp one
        shutil.rmtree(tmp, ignore_errors=True)
        marker = f" writing {tmp}"
        if marker not in str(exc):
            raise
        reason, rest = str(exc).split(marker, 1)
        raise OutputError(f"{reason} writing {path}{rest.split(';')[0]}; {_what_survived(path)}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_lines(path: str | Path, flag: str = "") -> list[str]:
    """Lines of a UTF-8 text file, split on ``\\n`` only (``str.splitlines`` would also split on U+2028 and
    misalign parallel files), without their line ends (``\\n`` or ``\\r\\n``), a final newline and a
    leading BOM; UserError naming the flag, the file (and line) if missing or undecodable."""
    where = f"{flag} {path}" if flag else str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{where}: no such file") from None
    except OSError as exc:
        raise UserError(f"{where}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UserError(
            f"{where}, line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); "
            "re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_parallel(source: str | Path, target: str | Path, source_flag: str = "--source",
                  target_flag: str = "--target", allow_empty: bool = False) -> tuple[list[str], list[str]]:
    """Two line-aligned files (``read_lines``): the same number of lines, and at least one unless
    ``allow_empty``; errors name both files by their flags (a flag "" names the path alone)."""
    sources, targets = read_lines(source, source_flag), read_lines(target, target_flag)
    def named(flag: str, path: str | Path) -> str:
        return f"{flag} {path}" if flag else str(path)

    if len(sources) != len(targets):
        raise UserError(f"{named(source_flag, source)} has {counted(len(sources), 'line')} but "
                        f"{named(target_flag, target)} has {len(targets)}; the files must be line-aligned (one "
                        "sentence per line)")
    if not sources and not allow_empty:
        raise UserError(f"{named(source_flag, source)} is empty: give at least one sentence pair")
    return sources, targets


def iter_lines(path: str | Path | None, flag: str = "", keep_ends: bool = False) -> Iterator[str]:
    """``read_lines`` one line at a time (constant memory), with the same decoding and errors; ``path``
    None or "-" reads standard input (a line as soon as it arrives: ``seq2seq translate`` as a filter).
    ``keep_ends``: each line as written, its line ending included (the lines concatenate to the file)."""
    if path in (None, "-"):
        where, handle = f"{flag} standard input" if flag else "standard input", nullcontext(sys.stdin.buffer)
    else:
        where = f"{flag} {path}" if flag else str(path)
        try:
            handle = Path(path).open("rb")
        except FileNotFoundError:
            raise UserError(f"{where}: no such file") from None
        except OSError as exc:
            raise UserError(f"{where}: cannot read ({exc.strerror or exc})") from None
    with handle as handle:
        for number, raw in enumerate(handle, start=1):  # binary iteration splits on b"\n" only
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"{where}, line {number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1}); re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
                ) from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            if keep_ends:
                yield line
                continue
            line = line.removesuffix("\n")
            yield line[:-1] if line.endswith("\r") else line
